// GEMM/GEMV for AVX-512F: 16-lane float32 vectors, 8 × 32 register tile (16 accumulators of
// the 32 zmm registers). bf16 inputs are widened to float32 as they are packed.
#include "gemm_isa.h"
#include "gemm_tiles.h"
#include "gemm_vec_avx512.h"

namespace neuron::kernels::detail {

void gemm_avx512(const GemmProblem& problem, const ParallelFor& parallel) {
  GemmTiles<Avx512Vec, 8>::run(problem, parallel);
}

}  // namespace neuron::kernels::detail
