// GEMM/GEMV at the AVX512-BF16 level. For now the float32 AVX-512 kernels (bf16 widened as it
// is packed); a vdpbf16ps micro-kernel for bf16 belongs here.
#include "gemm_isa.h"

namespace neuron::kernels::detail {

void gemm_avx512_bf16(const GemmProblem& problem, const ParallelFor& parallel) {
  gemm_avx512(problem, parallel);
}

}  // namespace neuron::kernels::detail
