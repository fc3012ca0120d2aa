// Row-wise and elementwise kernels of transformer training and inference: softmax and
// log-softmax over the last dimension (forward and backward), SiLU and the SiLU-gated MLP's
// silu(gate) * up (forward and backward), in float32 and bfloat16. Math is float32 throughout;
// bfloat16 results are rounded to nearest-even, as PyTorch's CPU kernels round them.
//
// Plain C++ over raw pointers (no torch types). Every function works on a range of rows
// (or elements) so the caller can split the work across its own threads.
#pragma once

#include <cstdint>

#include "cpu_features.h"

namespace neuron::kernels {

enum class RowDtype { kFloat32, kBFloat16 };

// One instruction-set level's implementations. Rows are contiguous, `cols` elements long,
// and `row_stride` elements apart in every operand.
struct RowKernels {
  // out = softmax(in) (or log_softmax when `log`), rows [row_begin, row_end).
  void (*softmax)(RowDtype dtype, bool log, const void* in, void* out, int64_t row_begin,
                  int64_t row_end, int64_t cols, int64_t row_stride);
  // grad_in from grad_out and the forward's output:
  //   softmax:     out * (grad_out - sum(grad_out * out))
  //   log_softmax: grad_out - exp(out) * sum(grad_out)
  void (*softmax_backward)(RowDtype dtype, bool log, const void* grad_out, const void* out,
                           void* grad_in, int64_t row_begin, int64_t row_end, int64_t cols,
                           int64_t row_stride);
  // out[i] = in[i] * sigmoid(in[i]), elements [begin, end).
  void (*silu)(RowDtype dtype, const void* in, void* out, int64_t begin, int64_t end);
  // grad_in[i] = grad_out[i] * s * (1 + x * (1 - s)), s = sigmoid(x).
  void (*silu_backward)(RowDtype dtype, const void* grad_out, const void* in, void* grad_in,
                        int64_t begin, int64_t end);
  // The SiLU-gated MLP's elementwise part: out[i] = silu(gate[i]) * up[i].
  void (*silu_mul)(RowDtype dtype, const void* gate, const void* up, void* out, int64_t begin,
                   int64_t end);
  // Its backward: grad_gate = grad * up * silu'(gate), grad_up = grad * silu(gate).
  void (*silu_mul_backward)(RowDtype dtype, const void* grad_out, const void* gate, const void* up,
                            void* grad_gate, void* grad_up, int64_t begin, int64_t end);
};

// The implementations for `level` (levels without their own code use the next lower one).
// Only call with a level the host supports (isa_level() or below).
const RowKernels& row_kernels_for(IsaLevel level);

// The implementations for isa_level().
const RowKernels& row_kernels();

}  // namespace neuron::kernels
