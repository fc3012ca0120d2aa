// The AVX512-BF16 loop of fma_peak_flops(): independent bf16 dot products (vdpbf16ps).
#include <immintrin.h>

#include "fma_peak_isa.h"

namespace neuron::kernels::detail {

double dpbf16_loop_avx512(int64_t iterations) {
  // Each vdpbf16ps: 16 lanes × 2 bf16 products, accumulated in float32.
  __m512 acc[16];
  for (auto& a : acc) a = _mm512_set1_ps(0.0f);
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3a83);
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 16
    for (auto& a : acc) a = _mm512_dpbf16_ps(a, x, y);
  }
  __m512 sum = acc[0];
  for (int i = 1; i < 16; ++i) sum = _mm512_add_ps(sum, acc[i]);
  volatile float sink = _mm512_cvtss_f32(sum);
  (void)sink;
  return 2.0 * 32 * 16 * static_cast<double>(iterations);
}

}  // namespace neuron::kernels::detail
