// Membership of each element in a set of values: torch.isin for integer tensors, which
// Transformers' generation calls on the whole vocabulary every step (min_length,
// min_new_tokens, suppress_tokens). PyTorch's CPU kernel compares element by element through
// a generic loop, ~9 ns an element here; this one takes one compare per test value (a few
// values) or a binary search over them sorted (many).
#pragma once

#include <cstdint>

namespace neuron::kernels {

// out[i] = (elements[i] is one of tests[0..t)) != invert, for i in [0, n).
void isin(const int64_t* elements, int64_t n, const int64_t* tests, int64_t t, bool invert,
          bool* out);
void isin(const int32_t* elements, int64_t n, const int32_t* tests, int64_t t, bool invert,
          bool* out);

}  // namespace neuron::kernels
