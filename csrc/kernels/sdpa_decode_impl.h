// The body of sdpa_decode(), written once over GCC/Clang vector types and compiled once per
// instruction set (sdpa_decode_baseline.cpp, sdpa_decode.avx2.cpp, sdpa_decode.avx512.cpp,
// sdpa_decode.avx512bf16.cpp). Include only from those files.
//
// Per (batch, kv head) group and its rows (the query heads sharing the kv head × the query
// rows), in key blocks small enough to stay in L1/L2 while every row of the group uses them:
//   1. scores: s = scale · q·k + mask, four keys at a time; keys whose mask is −inf for the
//      row are not read (a static cache's unused tail costs nothing);
//   2. p = exp(s − max) and its sum, in float32;
//   3. out += p · v, skipping keys with p = 0; then out /= sum, lse = max + log(sum).
// No std:: templates with out-of-line code here (see vec_exp.h): scratch comes from the
// caller (sdpa_decode.cpp).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "sdpa_decode_levels.h"
#include "vec_exp.h"

#if !defined(SDPA_DECODE_NAMESPACE) || !defined(SDPA_DECODE_WIDTH)
#error "define SDPA_DECODE_NAMESPACE and SDPA_DECODE_WIDTH before including sdpa_decode_impl.h"
#endif

namespace neuron::kernels::SDPA_DECODE_NAMESPACE {
namespace {

constexpr int kWidth = SDPA_DECODE_WIDTH;
constexpr int64_t kKeyBlock = 64;  // keys per block: 64 × 128 × 4 B = 32 KB of K or V
typedef float VecF __attribute__((vector_size(kWidth * sizeof(float))));
typedef int32_t VecI __attribute__((vector_size(kWidth * sizeof(int32_t))));
typedef uint32_t VecU __attribute__((vector_size(kWidth * sizeof(uint32_t))));
typedef uint16_t VecH __attribute__((vector_size(kWidth * sizeof(uint16_t))));
typedef float Vec4 __attribute__((vector_size(4 * sizeof(float))));  // one value per key of 4

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

inline VecF splat(float value) { return VecF{} + value; }

inline float bf16_value(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

// Round to nearest even; NaN becomes the canonical quiet NaN (as c10::BFloat16 does).
inline uint16_t bf16_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

inline VecF load(const float* p) {
  VecF v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline VecF load(const uint16_t* p) {
#if defined(__AVX512F__) && SDPA_DECODE_WIDTH == 16
  const __m512i wide =
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return (VecF)_mm512_slli_epi32(wide, 16);
#elif defined(__AVX2__) && SDPA_DECODE_WIDTH == 8
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return (VecF)_mm256_slli_epi32(wide, 16);
#else
  VecH h;
  std::memcpy(&h, p, sizeof h);
  return (VecF)(__builtin_convertvector(h, VecU) << 16);
#endif
}

inline void store(float* p, VecF v) { std::memcpy(p, &v, sizeof v); }

inline float scalar(const float* p) { return *p; }
inline float scalar(const uint16_t* p) { return bf16_value(*p); }

template <int kDistance, int... I>
inline VecF exchange(VecF v, std::integer_sequence<int, I...>) {
  return __builtin_shufflevector(v, v, (I ^ kDistance)...);
}

inline float horizontal_sum(VecF v) {
  const auto lanes = std::make_integer_sequence<int, kWidth>{};
  if constexpr (kWidth >= 16) v += exchange<8>(v, lanes);
  if constexpr (kWidth >= 8) v += exchange<4>(v, lanes);
  v += exchange<2>(v, lanes);
  v += exchange<1>(v, lanes);
  return v[0];
}

// Lane selectors for sums4(): with x, y of kWidth lanes, fold_low/high pick
// [x low half, y low half] and [x high half, y high half]; quarter_low/high pick, from
// [a | b] and [c | d] (halves), [a, b, c, d] low quarters and high quarters.
constexpr int kHalf = kWidth / 2, kQuarter = kWidth / 4;
constexpr int fold_low(int i) { return i < kHalf ? i : kWidth + i - kHalf; }
constexpr int fold_high(int i) { return i < kHalf ? i + kHalf : kWidth + i; }
constexpr int quarter_low(int i) {
  const int half = i / kHalf, within = i % kHalf;  // which input, lane in it
  const int source = within < kQuarter ? within : kHalf + within - kQuarter;
  return half * kWidth + source;
}
constexpr int quarter_high(int i) { return quarter_low(i) + kQuarter; }

template <int... I>
inline VecF fold(VecF x, VecF y, std::integer_sequence<int, I...>) {
  return __builtin_shufflevector(x, y, fold_low(I)...) +
         __builtin_shufflevector(x, y, fold_high(I)...);
}

template <int... I>
inline VecF quarters(VecF x, VecF y, std::integer_sequence<int, I...>) {
  return __builtin_shufflevector(x, y, quarter_low(I)...) +
         __builtin_shufflevector(x, y, quarter_high(I)...);
}

// The lane sums of four vectors at once: two folding steps leave each vector's partial sums
// in a quarter of one vector, then butterflies finish the quarters (a third of the
// shuffles and adds of four horizontal_sum calls).
inline Vec4 sums4(VecF a0, VecF a1, VecF a2, VecF a3) {
  const auto lanes = std::make_integer_sequence<int, kWidth>{};
  VecF v = quarters(fold(a0, a1, lanes), fold(a2, a3, lanes), lanes);
  if constexpr (kQuarter >= 4) v += exchange<2>(v, lanes);
  if constexpr (kQuarter >= 2) v += exchange<1>(v, lanes);
  return __builtin_shufflevector(v, v, 0, kQuarter, 2 * kQuarter, 3 * kQuarter);
}

float mask_at(const SdpaDecodeProblem& p, const void* row, int64_t key) {
  const int64_t offset = key * p.mask_stride[3];
  if (p.mask_dtype == AttentionDtype::kBFloat16) {
    return bf16_value(static_cast<const uint16_t*>(row)[offset]);
  }
  return static_cast<const float*>(row)[offset];
}

// Where one row of the group reads and writes.
template <class T>
struct Row {
  const T* q;
  const void* mask;  // null: no mask
  float* scores;     // kv_len
  float* q_float;    // head_dim rounded up to kWidth, zero padded
  float* acc;        // head_dim rounded up to kWidth
  float max = kNegInf;
  float sum = 0.0f;
};

// q·k for four keys and kRows rows at once (each K vector loaded once for all rows), in
// float32 (bf16 widened): kFull vectors of head dimension known at compile time when
// kFull > 0, else `full` vectors and a scalar tail. out[r][i]: row r, key i.
template <class T, int kFull, int kRows>
inline void dots(Row<T>* const* rows, const T* const* keys, int64_t head_dim, Vec4* out) {
  const int64_t full = kFull > 0 ? kFull : head_dim / kWidth;
  VecF acc[kRows][4] = {};
  for (int64_t d = 0; d < full; ++d) {
    const VecF k0 = load(keys[0] + d * kWidth), k1 = load(keys[1] + d * kWidth);
    const VecF k2 = load(keys[2] + d * kWidth), k3 = load(keys[3] + d * kWidth);
    for (int r = 0; r < kRows; ++r) {
      const VecF qv = load(rows[r]->q_float + d * kWidth);
      acc[r][0] += qv * k0;
      acc[r][1] += qv * k1;
      acc[r][2] += qv * k2;
      acc[r][3] += qv * k3;
    }
  }
  for (int r = 0; r < kRows; ++r) out[r] = sums4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
  if (kFull == 0) {
    for (int r = 0; r < kRows; ++r) {
      for (int64_t d = full * kWidth; d < head_dim; ++d) {
        for (int i = 0; i < 4; ++i) out[r][i] += rows[r]->q_float[d] * scalar(keys[i] + d);
      }
    }
  }
}

#if defined(__AVX512BF16__)
// bf16 q·k on vdpbf16ps (32 bf16 products per instruction, float32 sums), head_dim a
// multiple of 32: q and k are read as bf16 pairs without widening.
template <int kRows>
inline void dots_bf16_pairs(Row<uint16_t>* const* rows, const uint16_t* const* keys,
                            int64_t head_dim, Vec4* out) {
  __m512 acc[kRows][4];
  for (int r = 0; r < kRows; ++r) {
    for (int i = 0; i < 4; ++i) acc[r][i] = _mm512_setzero_ps();
  }
  for (int64_t d = 0; d < head_dim; d += 32) {
    __m512bh k[4];
    for (int i = 0; i < 4; ++i) k[i] = (__m512bh)_mm512_loadu_si512(keys[i] + d);
    for (int r = 0; r < kRows; ++r) {
      const __m512bh qv = (__m512bh)_mm512_loadu_si512(rows[r]->q + d);
      for (int i = 0; i < 4; ++i) acc[r][i] = _mm512_dpbf16_ps(acc[r][i], qv, k[i]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    out[r] = sums4((VecF)acc[r][0], (VecF)acc[r][1], (VecF)acc[r][2], (VecF)acc[r][3]);
  }
}
#endif

// Step 1 for keys [begin, end) of kRows rows.
template <class T, int kFull, int kRows>
void scores_block(const SdpaDecodeProblem& p, Row<T>* const* rows, const T* k_head, int64_t begin,
                  int64_t end) {
  const int64_t head_dim = p.head_dim;
  const Vec4 neg_inf = Vec4{} + kNegInf;
  Vec4 max[kRows];
  for (int r = 0; r < kRows; ++r) max[r] = Vec4{} + rows[r]->max;
  for (int64_t j = begin; j < end; j += 4) {
    const int n = static_cast<int>(end - j < 4 ? end - j : 4);
    Vec4 bias[kRows] = {};
    bool any = false;
    const T* keys[4];
    for (int i = 0; i < 4; ++i) {
      const int64_t key = j + (i < n ? i : 0);  // a short tail repeats its first key
      keys[i] = k_head + key * p.k_stride[2];
      for (int r = 0; r < kRows; ++r) {
        if (rows[r]->mask != nullptr) bias[r][i] = mask_at(p, rows[r]->mask, key);
        any = any || (i < n && bias[r][i] != kNegInf);
      }
    }
    Vec4 dot[kRows] = {};
    if (any) {
#if defined(__AVX512BF16__)
      if constexpr (std::is_same_v<T, uint16_t>) {
        if (head_dim % 32 == 0) {
          dots_bf16_pairs<kRows>(rows, keys, head_dim, dot);
        } else {
          dots<T, kFull, kRows>(rows, keys, head_dim, dot);
        }
      } else {
        dots<T, kFull, kRows>(rows, keys, head_dim, dot);
      }
#else
      dots<T, kFull, kRows>(rows, keys, head_dim, dot);
#endif
    }
    // Scale, bias and running max four keys at a time; a −inf bias stays −inf.
    for (int r = 0; r < kRows; ++r) {
      const Vec4 s = bias[r] == neg_inf ? neg_inf : dot[r] * p.scale + bias[r];
      if (n == 4) {
        std::memcpy(rows[r]->scores + j, &s, sizeof s);
        max[r] = s > max[r] ? s : max[r];
      } else {
        for (int i = 0; i < n; ++i) {
          rows[r]->scores[j + i] = s[i];
          max[r][0] = s[i] > max[r][0] ? s[i] : max[r][0];
        }
      }
    }
  }
  for (int r = 0; r < kRows; ++r) {
    float m = max[r][0];
    for (int i = 1; i < 4; ++i) m = max[r][i] > m ? max[r][i] : m;
    rows[r]->max = m;
  }
}

// Probabilities (in [0, 1], or the canonical NaN) rounded to bfloat16, nearest even.
inline VecF round_to_bf16(VecF v) {
  VecI bits;
  std::memcpy(&bits, &v, sizeof bits);
  bits += 0x7fff + ((bits >> 16) & 1);
  bits &= static_cast<int32_t>(0xffff0000u);
  VecF rounded;
  std::memcpy(&rounded, &bits, sizeof rounded);
  return rounded;
}

// Step 2: scores become exp(s − max), row.sum their sum (all 0 for a fully masked row).
// For bfloat16 inputs the probabilities P·V multiplies are rounded to bfloat16 (the sum is
// not), as the CPU's flash kernel stores them: results then differ from the CPU's by the
// summation order only, within the bfloat16 tolerance of the module conformance sweep,
// where probabilities kept in float32 differed by several bfloat16 units.
template <class T>
void exponentiate(const SdpaDecodeProblem& p, Row<T>& row) {
  constexpr bool kRoundProbabilities = std::is_same_v<T, uint16_t>;
  const int64_t n = p.kv_len, full = n - n % kWidth;
  if (row.max == kNegInf) {
    std::memset(row.scores, 0, sizeof(float) * static_cast<size_t>(n));
    return;
  }
  const VecF shift = splat(row.max);
  VecF total = VecF{};
  for (int64_t j = 0; j < full; j += kWidth) {
    const VecF e = exp_cephes<VecF, VecI>(load(row.scores + j) - shift);
    store(row.scores + j, kRoundProbabilities ? round_to_bf16(e) : e);
    total += e;
  }
  float sum = horizontal_sum(total);
  for (int64_t j = full; j < n; ++j) {
    float lanes[kWidth] = {};
    lanes[0] = row.scores[j] - row.max;
    VecF v;
    std::memcpy(&v, lanes, sizeof v);
    const float e = exp_cephes<VecF, VecI>(v)[0];
    sum += e;
    row.scores[j] = kRoundProbabilities ? bf16_value(bf16_bits(e)) : e;
  }
  row.sum = sum;
}

// Step 3 for keys [begin, end) of one row: acc += p · v.
template <class T, int kFull>
void accumulate_block(const SdpaDecodeProblem& p, Row<T>& row, const T* v_head, int64_t begin,
                      int64_t end) {
  const int64_t head_dim = p.head_dim;
  const int64_t full = kFull > 0 ? kFull : head_dim / kWidth;
  if constexpr (kFull > 0) {
    // Two accumulator sets (even and odd keys) so consecutive keys' multiply-adds do not
    // wait on each other's latency.
    VecF acc[kFull], odd[kFull];
    for (int d = 0; d < kFull; ++d) {
      acc[d] = load(row.acc + d * kWidth);
      odd[d] = VecF{};
    }
    int64_t j = begin;
    for (; j + 2 <= end; j += 2) {
      const float w0 = row.scores[j], w1 = row.scores[j + 1];
      if (w0 == 0.0f && w1 == 0.0f) continue;
      const T* v0 = v_head + j * p.v_stride[2];
      const T* v1 = v0 + p.v_stride[2];
      const VecF s0 = splat(w0), s1 = splat(w1);
      if (w1 == 0.0f) {
        for (int d = 0; d < kFull; ++d) acc[d] += s0 * load(v0 + d * kWidth);
      } else if (w0 == 0.0f) {
        for (int d = 0; d < kFull; ++d) odd[d] += s1 * load(v1 + d * kWidth);
      } else {
        for (int d = 0; d < kFull; ++d) {
          acc[d] += s0 * load(v0 + d * kWidth);
          odd[d] += s1 * load(v1 + d * kWidth);
        }
      }
    }
    if (j < end && row.scores[j] != 0.0f) {
      const T* v0 = v_head + j * p.v_stride[2];
      const VecF s0 = splat(row.scores[j]);
      for (int d = 0; d < kFull; ++d) acc[d] += s0 * load(v0 + d * kWidth);
    }
    for (int d = 0; d < kFull; ++d) store(row.acc + d * kWidth, acc[d] + odd[d]);
  } else {
    for (int64_t j = begin; j < end; ++j) {
      const float weight = row.scores[j];
      if (weight == 0.0f) continue;
      const T* v = v_head + j * p.v_stride[2];
      const VecF w = splat(weight);
      for (int64_t d = 0; d < full; ++d) {
        store(row.acc + d * kWidth, load(row.acc + d * kWidth) + w * load(v + d * kWidth));
      }
      for (int64_t d = full * kWidth; d < head_dim; ++d) row.acc[d] += weight * scalar(v + d);
    }
  }
}

// Step 3 for kRows rows at once (kFull > 0): each V vector is loaded once for all of them.
template <class T, int kFull, int kRows>
void accumulate_block_rows(const SdpaDecodeProblem& p, Row<T>* rows, const T* v_head, int64_t begin,
                           int64_t end) {
  VecF acc[kRows][kFull];
  for (int r = 0; r < kRows; ++r) {
    for (int d = 0; d < kFull; ++d) acc[r][d] = load(rows[r].acc + d * kWidth);
  }
  for (int64_t j = begin; j < end; ++j) {
    float w[kRows];
    bool any = false;
    for (int r = 0; r < kRows; ++r) {
      w[r] = rows[r].scores[j];
      any = any || w[r] != 0.0f;
    }
    if (!any) continue;
    const T* v = v_head + j * p.v_stride[2];
    for (int d = 0; d < kFull; ++d) {
      const VecF vv = load(v + d * kWidth);
      for (int r = 0; r < kRows; ++r) acc[r][d] += splat(w[r]) * vv;
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int d = 0; d < kFull; ++d) store(rows[r].acc + d * kWidth, acc[r][d]);
  }
}

template <class T, int kFull>
void run_rows(const SdpaDecodeProblem& p, int64_t group, int64_t row_begin, int64_t row_end,
              float* scratch) {
  constexpr int64_t kMaxRows = 64;  // rows per pass; sdpa_decode.cpp splits larger groups
  // Rows share K loads four at a time where 16 accumulators fit in registers (AVX-512),
  // else two; they share V loads as far as their accumulators fit.
  constexpr int kScoreRows = kWidth >= 16 ? 4 : 2;
  constexpr int kRegisters = kWidth >= 16 ? 16 : 6;  // for P·V accumulators
  constexpr int kValueRows = kFull == 0                ? 1
                             : 4 * kFull <= kRegisters ? 4
                             : 2 * kFull <= kRegisters ? 2
                                                       : 1;
  const int64_t b = group / p.kv_heads, kv_head = group % p.kv_heads;
  const int64_t heads_per_kv = p.q_heads / p.kv_heads;
  const int64_t padded = (p.head_dim + kWidth - 1) / kWidth * kWidth;
  const T* k_head = static_cast<const T*>(p.k) + b * p.k_stride[0] + kv_head * p.k_stride[1];
  const T* v_head = static_cast<const T*>(p.v) + b * p.v_stride[0] + kv_head * p.v_stride[1];

  for (int64_t first = row_begin; first < row_end; first += kMaxRows) {
    const int64_t rows = row_end - first < kMaxRows ? row_end - first : kMaxRows;
    Row<T> row_of[kMaxRows];
    float* next = scratch;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t index = first + r;
      const int64_t head = kv_head * heads_per_kv + index / p.q_len, q_row = index % p.q_len;
      Row<T>& row = row_of[r];
      row.q = static_cast<const T*>(p.q) + b * p.q_stride[0] + head * p.q_stride[1] +
              q_row * p.q_stride[2];
      row.mask = nullptr;
      if (p.mask != nullptr) {
        const int64_t offset =
            b * p.mask_stride[0] + head * p.mask_stride[1] + q_row * p.mask_stride[2];
        const size_t bytes = p.mask_dtype == AttentionDtype::kBFloat16 ? 2 : 4;
        row.mask = static_cast<const char*>(p.mask) + offset * static_cast<int64_t>(bytes);
      }
      row.scores = next;
      next += p.kv_len;
      row.q_float = next;
      next += padded;
      row.acc = next;
      next += padded;
      for (int64_t d = 0; d < padded; ++d) {
        row.q_float[d] = d < p.head_dim ? scalar(row.q + d) : 0.0f;
        row.acc[d] = 0.0f;
      }
    }
    for (int64_t begin = 0; begin < p.kv_len; begin += kKeyBlock) {
      const int64_t end = p.kv_len - begin < kKeyBlock ? p.kv_len : begin + kKeyBlock;
      int64_t r = 0;
      for (; r + kScoreRows <= rows; r += kScoreRows) {
        Row<T>* group_rows[kScoreRows];
        for (int i = 0; i < kScoreRows; ++i) group_rows[i] = &row_of[r + i];
        scores_block<T, kFull, kScoreRows>(p, group_rows, k_head, begin, end);
      }
      if constexpr (kScoreRows > 2) {
        for (; r + 2 <= rows; r += 2) {
          Row<T>* pair[2] = {&row_of[r], &row_of[r + 1]};
          scores_block<T, kFull, 2>(p, pair, k_head, begin, end);
        }
      }
      for (; r < rows; ++r) {
        Row<T>* single[1] = {&row_of[r]};
        scores_block<T, kFull, 1>(p, single, k_head, begin, end);
      }
    }
    for (int64_t r = 0; r < rows; ++r) exponentiate(p, row_of[r]);
    for (int64_t begin = 0; begin < p.kv_len; begin += kKeyBlock) {
      const int64_t end = p.kv_len - begin < kKeyBlock ? p.kv_len : begin + kKeyBlock;
      int64_t r = 0;
      if constexpr (kValueRows > 1) {
        for (; r + kValueRows <= rows; r += kValueRows) {
          accumulate_block_rows<T, kFull, kValueRows>(p, &row_of[r], v_head, begin, end);
        }
      }
      if constexpr (kValueRows > 2) {
        for (; r + 2 <= rows; r += 2) {
          accumulate_block_rows<T, kFull, 2>(p, &row_of[r], v_head, begin, end);
        }
      }
      for (; r < rows; ++r) accumulate_block<T, kFull>(p, row_of[r], v_head, begin, end);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const Row<T>& row = row_of[r];
      const int64_t index = first + r;
      const int64_t head = kv_head * heads_per_kv + index / p.q_len, q_row = index % p.q_len;
      const float sum = row.sum == 0.0f ? 1.0f : row.sum;
      const float inverse = 1.0f / sum;
      T* out = static_cast<T*>(p.out) + b * p.out_stride[0] + head * p.out_stride[1] +
               q_row * p.out_stride[2];
      for (int64_t d = 0; d < p.head_dim; ++d) {
        const float value = row.acc[d] * inverse;
        if constexpr (std::is_same_v<T, float>) {
          out[d] = value;
        } else {
          out[d] = bf16_bits(value);
        }
      }
      if (p.lse != nullptr) {
        p.lse[b * p.lse_stride[0] + head * p.lse_stride[1] + q_row * p.lse_stride[2]] =
            (row.max == kNegInf ? 0.0f : row.max) + std::log(sum);
      }
    }
  }
}

template <class T>
void run_rows_for(const SdpaDecodeProblem& p, int64_t group, int64_t row_begin, int64_t row_end,
                  float* scratch) {
  // The head dimensions models use get their vectors unrolled and held in registers.
  if (p.head_dim == 64) {
    run_rows<T, 64 / kWidth>(p, group, row_begin, row_end, scratch);
  } else if (p.head_dim == 128 && kWidth >= 8) {
    run_rows<T, 128 / kWidth>(p, group, row_begin, row_end, scratch);
  } else {
    run_rows<T, 0>(p, group, row_begin, row_end, scratch);
  }
}

void rows_entry(const SdpaDecodeProblem& p, int64_t group, int64_t row_begin, int64_t row_end,
                float* scratch) {
  if (p.dtype == AttentionDtype::kBFloat16) {
    run_rows_for<uint16_t>(p, group, row_begin, row_end, scratch);
  } else {
    run_rows_for<float>(p, group, row_begin, row_end, scratch);
  }
}

}  // namespace
}  // namespace neuron::kernels::SDPA_DECODE_NAMESPACE
