// The AVX2 loop of fma_peak_flops(): independent float32 fused multiply-adds, no memory traffic.
#include <immintrin.h>

#include "fma_peak_isa.h"

namespace neuron::kernels::detail {

double fma_loop_avx2(int64_t iterations) {
  // 12 independent chains cover the FMA latency × issue width of current cores.
  __m256 acc[12];
  for (auto& a : acc) a = _mm256_set1_ps(0.0f);
  const __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(1e-3f);
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 12
    for (auto& a : acc) a = _mm256_fmadd_ps(a, x, y);
  }
  __m256 sum = acc[0];
  for (int i = 1; i < 12; ++i) sum = _mm256_add_ps(sum, acc[i]);
  volatile float sink = _mm256_cvtss_f32(sum);
  (void)sink;
  return 2.0 * 8 * 12 * static_cast<double>(iterations);
}

}  // namespace neuron::kernels::detail
