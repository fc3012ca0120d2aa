// The per-instruction-set GEMM entry points behind gemm() (gemm.cpp picks one at run time).
#pragma once

#include "gemm.h"

namespace neuron::kernels::detail {

void gemm_scalar(const GemmProblem& problem, const ParallelFor& parallel);
void gemm_avx2(const GemmProblem& problem, const ParallelFor& parallel);
void gemm_avx512(const GemmProblem& problem, const ParallelFor& parallel);
void gemm_avx512_bf16(const GemmProblem& problem, const ParallelFor& parallel);

// A bfloat16 GEMV (m <= 8, B's k index contiguous) with vdpbf16ps (gemv_bf16.avx512bf16.cpp).
void gemv_bf16_pairs(const GemmProblem& problem, const ParallelFor& parallel);

}  // namespace neuron::kernels::detail
