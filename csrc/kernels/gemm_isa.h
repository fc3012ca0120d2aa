// The per-instruction-set GEMM entry points behind gemm() (gemm.cpp picks one at run time).
#pragma once

#include "gemm.h"

namespace neuron::kernels::detail {

void gemm_scalar(const GemmProblem& problem, const ParallelFor& parallel);
void gemm_avx2(const GemmProblem& problem, const ParallelFor& parallel);
void gemm_avx512(const GemmProblem& problem, const ParallelFor& parallel);
void gemm_avx512_bf16(const GemmProblem& problem, const ParallelFor& parallel);

}  // namespace neuron::kernels::detail
