// The element-wise reductions for AVX2 + FMA + F16C hosts (flags from CMakeLists.txt); reached
// only through combine() after isa_level() says the host has them.
#include <immintrin.h>

#include "element_kernels.h"

namespace nrt::dist {
namespace {

struct Avx2Codec {
  static void bf16_to_float(float* out, const uint16_t* in, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                          _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    ScalarCodec::bf16_to_float(out + i, in + i, n - i);
  }
  // Round to nearest even; NaN stays NaN (quiet): as scalar_float_to_bf16.
  static void float_to_bf16(uint16_t* out, const float* in, size_t n) {
    const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7FFF),
                  quiet = _mm256_set1_epi32(0x400000);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256 f = _mm256_loadu_ps(in + i);
      const __m256i bits = _mm256_castps_si256(f);
      const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), one);
      const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(bias, lsb));
      const __m256 nan = _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
      const __m256i chosen = _mm256_castps_si256(_mm256_blendv_ps(
          _mm256_castsi256_ps(rounded), _mm256_castsi256_ps(_mm256_or_si256(bits, quiet)), nan));
      const __m256i high = _mm256_srli_epi32(chosen, 16);  // <= 0xFFFF: packs exactly
      _mm_storeu_si128(
          reinterpret_cast<__m128i*>(out + i),
          _mm_packus_epi32(_mm256_castsi256_si128(high), _mm256_extracti128_si256(high, 1)));
    }
    ScalarCodec::float_to_bf16(out + i, in + i, n - i);
  }
  static void f16_to_float(float* out, const uint16_t* in, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      _mm256_storeu_ps(out + i,
                       _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
    }
    ScalarCodec::f16_to_float(out + i, in + i, n - i);
  }
  static void float_to_f16(uint16_t* out, const float* in, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      _mm_storeu_si128(
          reinterpret_cast<__m128i*>(out + i),
          _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    ScalarCodec::float_to_f16(out + i, in + i, n - i);
  }
};

}  // namespace

void combine_avx2(void* dst, const void* a, const void* b, size_t count, ElementType type,
                  ReduceOp op) {
  combine_all<Avx2Codec>(dst, a, b, count, type, op);
}

}  // namespace nrt::dist
