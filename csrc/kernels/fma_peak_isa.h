// Per-instruction-set loops behind fma_peak_flops(); each returns the flops it executed.
#pragma once

#include <cstdint>

namespace neuron::kernels::detail {

double fma_loop_avx2(int64_t iterations);
double fma_loop_avx512(int64_t iterations);
double dpbf16_loop_avx512(int64_t iterations);

}  // namespace neuron::kernels::detail
