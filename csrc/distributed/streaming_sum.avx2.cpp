// add_streaming_bf16's vector loop with AVX2 (flags from CMakeLists.txt). Reached only
// through streaming_sum.cpp after isa_level() says the host has AVX2.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace nrt::dist {
namespace {

// 8 float32 sums → their bf16 bits (round to nearest even, NaN kept quiet) in the low 16
// of each 32-bit lane, sign-extended so a signed pack keeps them exactly.
__m256i narrow8(__m256 sum) {
  const __m256i bits = _mm256_castps_si256(sum);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(sum, sum, _CMP_UNORD_Q));
  const __m256i quiet = _mm256_or_si256(bits, _mm256_set1_epi32(0x400000));
  return _mm256_srai_epi32(_mm256_blendv_epi8(rounded, quiet, nan), 16);
}

}  // namespace

// dst 32-byte aligned, n a multiple of 16.
void add_streaming_bf16_avx2(uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t n,
                             uint16_t* cached) {
  const __m256i zero = _mm256_setzero_si256();
  for (size_t k = 0; k < n; k += 16) {
    const __m256i va = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + k));
    const __m256i vb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + k));
    // Unpacking and packing both work within 128-bit halves, so the order comes back.
    const __m256 lo = _mm256_add_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, va)),
                                    _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, vb)));
    const __m256 hi = _mm256_add_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, va)),
                                    _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, vb)));
    const __m256i sums = _mm256_packs_epi32(narrow8(lo), narrow8(hi));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + k), sums);
    if (cached != nullptr) _mm256_storeu_si256(reinterpret_cast<__m256i*>(cached + k), sums);
  }
}

}  // namespace nrt::dist
