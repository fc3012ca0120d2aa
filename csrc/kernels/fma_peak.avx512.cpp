// The AVX-512 loop of fma_peak_flops(): independent float32 fused multiply-adds, no memory
// traffic.
#include <immintrin.h>

#include "fma_peak_isa.h"

namespace neuron::kernels::detail {

double fma_loop_avx512(int64_t iterations) {
  __m512 acc[16];
  for (auto& a : acc) a = _mm512_set1_ps(0.0f);
  const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-3f);
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
    for (auto& a : acc) a = _mm512_fmadd_ps(a, x, y);
  }
  __m512 sum = acc[0];
  for (int i = 1; i < 16; ++i) sum = _mm512_add_ps(sum, acc[i]);
  volatile float sink = _mm512_cvtss_f32(sum);
  (void)sink;
  return 2.0 * 16 * 16 * static_cast<double>(iterations);
}

}  // namespace neuron::kernels::detail
