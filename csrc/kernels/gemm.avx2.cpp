// GEMM/GEMV for AVX2 + FMA: 8-lane float32 vectors, 6 × 16 register tile (12 accumulators
// of the 16 ymm registers). bf16 inputs are widened to float32 as they are packed.
#include <immintrin.h>

#include "gemm_isa.h"
#include "gemm_tiles.h"

namespace neuron::kernels::detail {
namespace {

struct Avx2Vec {
  using Reg = __m256;
  static constexpr int kWidth = 8;
  static constexpr int kRegisters = 16;
  static Reg zero() { return _mm256_setzero_ps(); }
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
  static Reg load(const uint16_t* p) {
    const __m128i half = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(half), 16));
  }
  // 16 bf16 as 8 pairs: even-indexed elements to *even, odd-indexed to *odd (one shift or
  // mask each, where load widens 8 with a shuffle and a shift).
  static void load_pairs(const uint16_t* p, Reg* even, Reg* odd) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    *even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    *odd = _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32(-65536)));
  }
  static void store(float* p, Reg v) { _mm256_storeu_ps(p, v); }
  // Rounded to nearest even, NaN → 0x7FC0, as float_to_bf16_rne.
  static void store(uint16_t* p, Reg v) {
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    const __m256i bias = _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(bits, bias), 16);
    const __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
    const __m256i nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
    r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), nan);
    const __m128i halves =
        _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), halves);
  }
  static Reg set1(float v) { return _mm256_set1_ps(v); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static Reg add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  static float sum(Reg v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
};

}  // namespace

void gemm_avx2(const GemmProblem& problem, const ParallelFor& parallel) {
  GemmTiles<Avx2Vec, 6>::run(problem, parallel);
}

}  // namespace neuron::kernels::detail
