// Dense matrix products for linear layers and their backward passes, in float32 and
// bfloat16 (bf16 inputs, float32 accumulation, bf16 result rounded to nearest-even as
// PyTorch's CPU kernels round), over strided row/column views so every transpose a linear
// layer produces (X·Wᵀ, dY·W, dYᵀ·X) is read in place.
//
//   C[b] = alpha · A[b]·B[b] + beta · bias[b]      (bias optional, any strides, 0 = broadcast)
//
// Threads come from the caller (csrc/aten passes at::parallel_for), so this library never
// starts its own.
#pragma once

#include <cstdint>
#include <functional>

#include "cpu_features.h"

namespace neuron::kernels {

enum class GemmDtype { kFloat32, kBFloat16 };

// A strided matrix view: element (i, j) is at data + i * row_stride + j * col_stride
// (in elements of the GEMM's dtype); batch_stride moves between the batch's matrices.
struct MatrixRef {
  const void* data = nullptr;
  int64_t row_stride = 0;
  int64_t col_stride = 0;
  int64_t batch_stride = 0;
};

struct GemmProblem {
  int64_t batch = 1;
  int64_t m = 0, n = 0, k = 0;
  GemmDtype dtype = GemmDtype::kFloat32;  // of A, B, C and bias alike
  MatrixRef a;                            // m × k
  MatrixRef b;                            // k × n
  MatrixRef bias;                         // m × n, read only when bias.data is set
  void* c = nullptr;                      // m × n, overlapping none of A, B and bias
  int64_t c_row_stride = 0;
  int64_t c_col_stride = 1;
  int64_t c_batch_stride = 0;
  float alpha = 1.0f;
  float beta = 1.0f;
};

// Runs body(begin, end) over [0, tasks) split among the caller's threads; called once per
// GEMM. `threads` is how many run at once (sizes the task split).
struct ParallelFor {
  int threads = 1;
  std::function<void(int64_t tasks, const std::function<void(int64_t, int64_t)>& body)> run;
};

// A ParallelFor that runs everything on the calling thread.
ParallelFor serial_for();

// Computes the problem with the instructions of `level` (capped at what the host has).
// Throws std::invalid_argument for inconsistent sizes or a missing pointer.
void gemm(const GemmProblem& problem, const ParallelFor& parallel, IsaLevel level);

// The same at isa_level().
void gemm(const GemmProblem& problem, const ParallelFor& parallel);

// Whether gemm() is the better choice than oneDNN (PyTorch's CPU kernel) for a product of
// m rows and n columns, from benchmarks/gemm.py on this project's hosts: at AVX512-BF16 and
// above, oneDNN's bf16 GEMM (vdpbf16ps or AMX) reaches 70-85% of peak where ours reaches
// 40-65%, so bf16 with m > 8 and n > 8 goes to oneDNN there; GEMVs (m <= 8 or n <= 8: ours
// stream the weights at 2-3x oneDNN's rate), float32, and bf16 on hosts without native bf16
// (where PyTorch's CPU bf16 GEMM is far below float32) are ours.
bool gemm_preferred(GemmDtype dtype, int64_t m, int64_t n, IsaLevel level);

// float → bfloat16 bits, round to nearest even; NaN → 0x7FC0 (as c10::BFloat16 does).
inline uint16_t float_to_bf16_rne(float value) {
  uint32_t bits;
  __builtin_memcpy(&bits, &value, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

inline float bf16_to_float(uint16_t value) {
  const uint32_t bits = static_cast<uint32_t>(value) << 16;
  float out;
  __builtin_memcpy(&out, &bits, sizeof(out));
  return out;
}

}  // namespace neuron::kernels
