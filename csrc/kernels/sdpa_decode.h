// Scaled dot-product attention for a few query rows against a long key/value sequence: the
// decode step of a language model reading its KV cache. For each batch b, query head h and
// query row l:
//
//   s[j]  = scale · q[b,h,l]·k[b,h/G,j] + mask[b,h,l,j]        (j < kv_len; G = q/kv heads)
//   out   = Σ_j softmax(s)[j] · v[b,h/G,j]
//   lse   = max(s) + log Σ_j exp(s[j] − max(s))
//
// A row whose mask is −inf everywhere gives out = 0 and lse = 0 (as PyTorch's CPU flash
// kernel does). Inputs are strided views (a static cache slice is read in place); only the
// head dimension must be contiguous. bf16 inputs accumulate in float32 and round the output
// once. K and V of one kv head are read from memory once for all G query heads that share
// it, which is what bounds decode: the kernel is a pass over the cache.
#pragma once

#include <cstdint>

#include "cpu_features.h"
#include "gemm.h"  // ParallelFor

namespace neuron::kernels {

enum class AttentionDtype { kFloat32, kBFloat16 };

// Strides are in elements of the tensor's own dtype. The head dimension has stride 1.
struct SdpaDecodeProblem {
  int64_t batch = 0, q_heads = 0, kv_heads = 0, q_len = 0, kv_len = 0, head_dim = 0;
  AttentionDtype dtype = AttentionDtype::kFloat32;  // of q, k, v and out
  const void* q = nullptr;
  int64_t q_stride[3] = {};  // batch, head, row
  const void* k = nullptr;
  int64_t k_stride[3] = {};  // batch, head, key
  const void* v = nullptr;
  int64_t v_stride[3] = {};  // batch, head, key
  // Additive mask (optional), broadcast by stride 0: batch, head, row, key.
  const void* mask = nullptr;
  AttentionDtype mask_dtype = AttentionDtype::kFloat32;
  int64_t mask_stride[4] = {};
  void* out = nullptr;
  int64_t out_stride[3] = {};  // batch, head, row
  float* lse = nullptr;        // float32, may be null
  int64_t lse_stride[3] = {};  // batch, head, row
  float scale = 1.0f;
};

// Computes the problem with the instructions of `level` (capped at what the host has),
// splitting (batch, kv head, row group) work among `parallel`'s threads. Throws
// std::invalid_argument for inconsistent sizes or a missing pointer.
void sdpa_decode(const SdpaDecodeProblem& problem, const ParallelFor& parallel, IsaLevel level);

// The same at isa_level().
void sdpa_decode(const SdpaDecodeProblem& problem, const ParallelFor& parallel);

}  // namespace neuron::kernels
