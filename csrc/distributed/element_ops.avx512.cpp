// The element-wise reductions for AVX-512 (F/BW/VL/DQ) hosts (flags from CMakeLists.txt);
// reached only through combine() after isa_level() says the host has them.
#include <immintrin.h>

#include "element_kernels.h"

namespace nrt::dist {
namespace {

struct Avx512Codec {
  static void bf16_to_float(float* out, const uint16_t* in, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
      _mm512_storeu_si512(out + i, _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
    ScalarCodec::bf16_to_float(out + i, in + i, n - i);
  }
  // Round to nearest even; NaN stays NaN (quiet): as scalar_float_to_bf16. (AVX512-BF16's
  // VCVTNEPS2BF16 flushes subnormals, so it would not give the same bits.)
  static void float_to_bf16(uint16_t* out, const float* in, size_t n) {
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7FFF),
                  quiet = _mm512_set1_epi32(0x400000);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m512 f = _mm512_loadu_ps(in + i);
      const __m512i bits = _mm512_castps_si512(f);
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), one);
      const __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(bias, lsb));
      const __mmask16 nan = _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
      const __m512i chosen = _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(bits, quiet));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                          _mm512_cvtepi32_epi16(_mm512_srli_epi32(chosen, 16)));
    }
    ScalarCodec::float_to_bf16(out + i, in + i, n - i);
  }
  static void f16_to_float(float* out, const uint16_t* in, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
      _mm512_storeu_ps(
          out + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i))));
    }
    ScalarCodec::f16_to_float(out + i, in + i, n - i);
  }
  static void float_to_f16(uint16_t* out, const float* in, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
      _mm256_storeu_si256(
          reinterpret_cast<__m256i*>(out + i),
          _mm512_cvtps_ph(_mm512_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    ScalarCodec::float_to_f16(out + i, in + i, n - i);
  }
};

}  // namespace

void combine_avx512(void* dst, const void* a, const void* b, size_t count, ElementType type,
                    ReduceOp op) {
  combine_all<Avx512Codec>(dst, a, b, count, type, op);
}

}  // namespace nrt::dist
