// The row kernels, written once over GCC/Clang vector types and compiled once per
// instruction set (row_kernels_baseline.cpp, row_kernels.avx2.cpp, row_kernels.avx512.cpp),
// each with its own vector width and compiler flags. Include only from those files: it
// defines ROW_KERNELS_NAMESPACE::kRowKernels.
//
// Why vector types rather than intrinsics: the same source then gives SSE2, AVX2 and
// AVX-512 code (the compiler picks the instructions for the width), so every level runs
// the same algorithm and differs only in the order of float additions.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "row_kernels.h"
#include "row_kernels_levels.h"
#include "vec_exp.h"

// No std:: templates with out-of-line code here (std::vector and the like): their weak
// instances could be shared with baseline translation units and run AVX-512 code on a host
// without it. Buffers come from row_scratch() in the baseline row_kernels.cpp.

#if !defined(ROW_KERNELS_NAMESPACE) || !defined(ROW_KERNELS_WIDTH)
#error "define ROW_KERNELS_NAMESPACE and ROW_KERNELS_WIDTH before including row_kernels_impl.h"
#endif

namespace neuron::kernels::ROW_KERNELS_NAMESPACE {
namespace {

constexpr int kWidth = ROW_KERNELS_WIDTH;
typedef float VecF __attribute__((vector_size(kWidth * sizeof(float))));
typedef int32_t VecI __attribute__((vector_size(kWidth * sizeof(int32_t))));
typedef uint32_t VecU __attribute__((vector_size(kWidth * sizeof(uint32_t))));
typedef uint16_t VecH __attribute__((vector_size(kWidth * sizeof(uint16_t))));

inline VecF splat(float value) { return VecF{} + value; }

inline float bf16_to_float(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

// Round to nearest even; NaN becomes the canonical quiet NaN (as c10::BFloat16 does).
// Returns the 16-bit patterns in the low halves of 32-bit lanes.
inline VecU float_to_bf16_lanes(VecF value) {
  const VecU bits = (VecU)value;
  VecU rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const VecU is_nan = (VecU)(value != value);
  return (rounded & ~is_nan) | (0x7fc0u & is_nan);
}

// Widening 16 -> 32 and narrowing 32 -> 16 bits: the compiler's generic lowering of
// __builtin_convertvector shuffles across lanes; one instruction each does it where known.
inline VecU widen_u16(const uint16_t* p) {
#if defined(__AVX512F__) && ROW_KERNELS_WIDTH == 16
  return (VecU)_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#elif defined(__AVX2__) && ROW_KERNELS_WIDTH == 8
  return (VecU)_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  VecH h;
  std::memcpy(&h, p, sizeof h);
  return __builtin_convertvector(h, VecU);
#endif
}

inline void narrow_u16(uint16_t* p, VecU lanes) {
#if defined(__AVX512F__) && ROW_KERNELS_WIDTH == 16
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16((__m512i)lanes));
#elif defined(__AVX2__) && ROW_KERNELS_WIDTH == 8
  const __m256i wide = (__m256i)lanes;  // every lane <= 0xffff: unsigned saturation is exact
  _mm_storeu_si128(
      reinterpret_cast<__m128i*>(p),
      _mm_packus_epi32(_mm256_castsi256_si128(wide), _mm256_extracti128_si256(wide, 1)));
#else
  const VecH h = __builtin_convertvector(lanes, VecH);
  std::memcpy(p, &h, sizeof h);
#endif
}

// Loads and stores of kWidth elements at p[i..], and of n < kWidth elements (the rest of
// the vector is `fill`).
struct Float32Io {
  static VecF load(const void* p, int64_t i) {
    VecF v;
    std::memcpy(&v, static_cast<const float*>(p) + i, sizeof v);
    return v;
  }
  static VecF load_partial(const void* p, int64_t i, int n, float fill) {
    VecF v = splat(fill);
    std::memcpy(&v, static_cast<const float*>(p) + i, sizeof(float) * n);
    return v;
  }
  static void store(void* p, int64_t i, VecF v) {
    std::memcpy(static_cast<float*>(p) + i, &v, sizeof v);
  }
  static void store_partial(void* p, int64_t i, int n, VecF v) {
    std::memcpy(static_cast<float*>(p) + i, &v, sizeof(float) * n);
  }
};

struct BFloat16Io {
  static VecF load(const void* p, int64_t i) {
    return (VecF)(widen_u16(static_cast<const uint16_t*>(p) + i) << 16);
  }
  static VecF load_partial(const void* p, int64_t i, int n, float fill) {
    float lanes[kWidth];
    const uint16_t* src = static_cast<const uint16_t*>(p) + i;
    for (int k = 0; k < kWidth; ++k) lanes[k] = k < n ? bf16_to_float(src[k]) : fill;
    VecF v;
    std::memcpy(&v, lanes, sizeof v);
    return v;
  }
  static void store(void* p, int64_t i, VecF v) {
    narrow_u16(static_cast<uint16_t*>(p) + i, float_to_bf16_lanes(v));
  }
  static void store_partial(void* p, int64_t i, int n, VecF v) {
    uint16_t lanes[kWidth];
    narrow_u16(lanes, float_to_bf16_lanes(v));
    std::memcpy(static_cast<uint16_t*>(p) + i, lanes, sizeof(uint16_t) * n);
  }
};

// Lane i exchanged with lane i ^ kDistance (a butterfly step of a reduction tree).
template <int kDistance, int... I>
inline VecF exchange(VecF v, std::integer_sequence<int, I...>) {
  return __builtin_shufflevector(v, v, (I ^ kDistance)...);
}

// Reductions across lanes in log2(kWidth) steps; every lane ends with the result.
template <class Combine>
inline float reduce_lanes(VecF v, Combine combine) {
  const auto lanes = std::make_integer_sequence<int, kWidth>{};
  if constexpr (kWidth >= 16) v = combine(v, exchange<8>(v, lanes));
  if constexpr (kWidth >= 8) v = combine(v, exchange<4>(v, lanes));
  v = combine(v, exchange<2>(v, lanes));
  v = combine(v, exchange<1>(v, lanes));
  return v[0];
}

inline float horizontal_sum(VecF v) {
  return reduce_lanes(v, [](VecF a, VecF b) { return a + b; });
}

inline float horizontal_max(VecF v) {
  return reduce_lanes(v, [](VecF a, VecF b) { return a > b ? a : b; });
}

inline VecF exp_vec(VecF x) { return exp_cephes<VecF, VecI>(x); }

inline VecF sigmoid_vec(VecF x) { return 1.0f / (1.0f + exp_vec(-x)); }

template <class Io, bool log>
void softmax_row(const void* in, void* out, int64_t base, int64_t cols) {
  const int64_t full = cols - cols % kWidth;
  const int rest = static_cast<int>(cols - full);
  const float neg_inf = -std::numeric_limits<float>::infinity();

  VecF max_acc = splat(neg_inf);
  for (int64_t j = 0; j < full; j += kWidth) {
    const VecF v = Io::load(in, base + j);
    max_acc = v > max_acc ? v : max_acc;
  }
  if (rest) {
    const VecF v = Io::load_partial(in, base + full, rest, neg_inf);
    max_acc = v > max_acc ? v : max_acc;
  }
  const float row_max = horizontal_max(max_acc);

  // exp(x - max): kept in float32 for softmax (in `out` itself when it is float32).
  constexpr bool kFloatOut = std::is_same_v<Io, Float32Io>;
  float* exps = log ? nullptr : (kFloatOut ? static_cast<float*>(out) + base : row_scratch(cols));
  VecF sum_acc = splat(0.0f);
  for (int64_t j = 0; j < full; j += kWidth) {
    const VecF e = exp_vec(Io::load(in, base + j) - row_max);
    sum_acc += e;
    if (exps) Float32Io::store(exps, j, e);
  }
  if (rest) {
    const VecF e = exp_vec(Io::load_partial(in, base + full, rest, neg_inf) - row_max);
    sum_acc += e;
    if (exps) Float32Io::store_partial(exps, full, rest, e);
  }
  const float sum = horizontal_sum(sum_acc);

  if constexpr (log) {
    const float log_sum = std::log(sum);
    for (int64_t j = 0; j < full; j += kWidth) {
      Io::store(out, base + j, (Io::load(in, base + j) - row_max) - log_sum);
    }
    if (rest) {
      Io::store_partial(out, base + full, rest,
                        (Io::load_partial(in, base + full, rest, 0.0f) - row_max) - log_sum);
    }
  } else {
    const float inverse = 1.0f / sum;
    for (int64_t j = 0; j < full; j += kWidth) {
      Io::store(out, base + j, Float32Io::load(exps, j) * inverse);
    }
    if (rest) {
      Io::store_partial(out, base + full, rest,
                        Float32Io::load_partial(exps, full, rest, 0.0f) * inverse);
    }
  }
}

template <class Io, bool log>
void softmax_backward_row(const void* grad_out, const void* out, void* grad_in, int64_t base,
                          int64_t cols) {
  const int64_t full = cols - cols % kWidth;
  const int rest = static_cast<int>(cols - full);
  // softmax: sum(g * y); log_softmax: sum(g).
  VecF acc = splat(0.0f);
  for (int64_t j = 0; j < full; j += kWidth) {
    const VecF g = Io::load(grad_out, base + j);
    if constexpr (log) {
      acc += g;
    } else {
      acc += g * Io::load(out, base + j);
    }
  }
  if (rest) {
    const VecF g = Io::load_partial(grad_out, base + full, rest, 0.0f);
    if constexpr (log) {
      acc += g;
    } else {
      acc += g * Io::load_partial(out, base + full, rest, 0.0f);
    }
  }
  const float total = horizontal_sum(acc);
  auto grad = [total](VecF g, VecF y) {
    if constexpr (log) {
      return g - exp_vec(y) * total;
    } else {
      return y * (g - total);
    }
  };
  for (int64_t j = 0; j < full; j += kWidth) {
    Io::store(grad_in, base + j, grad(Io::load(grad_out, base + j), Io::load(out, base + j)));
  }
  if (rest) {
    Io::store_partial(grad_in, base + full, rest,
                      grad(Io::load_partial(grad_out, base + full, rest, 0.0f),
                           Io::load_partial(out, base + full, rest, 0.0f)));
  }
}

template <class Io, class Fn>
void elementwise(int64_t begin, int64_t end, Fn&& fn) {
  int64_t i = begin;
  for (; i + kWidth <= end; i += kWidth) fn(i, kWidth);
  if (i < end) fn(i, static_cast<int>(end - i));
}

template <class Io>
void silu_range(const void* in, void* out, int64_t begin, int64_t end) {
  elementwise<Io>(begin, end, [&](int64_t i, int n) {
    const VecF x = n == kWidth ? Io::load(in, i) : Io::load_partial(in, i, n, 0.0f);
    const VecF y = x / (1.0f + exp_vec(-x));
    if (n == kWidth) {
      Io::store(out, i, y);
    } else {
      Io::store_partial(out, i, n, y);
    }
  });
}

template <class Io>
void silu_backward_range(const void* grad_out, const void* in, void* grad_in, int64_t begin,
                         int64_t end) {
  elementwise<Io>(begin, end, [&](int64_t i, int n) {
    const bool whole = n == kWidth;
    const VecF g = whole ? Io::load(grad_out, i) : Io::load_partial(grad_out, i, n, 0.0f);
    const VecF x = whole ? Io::load(in, i) : Io::load_partial(in, i, n, 0.0f);
    const VecF s = sigmoid_vec(x);
    const VecF d = g * s * (1.0f + x * (1.0f - s));
    if (whole) {
      Io::store(grad_in, i, d);
    } else {
      Io::store_partial(grad_in, i, n, d);
    }
  });
}

template <class Io>
void silu_mul_range(const void* gate, const void* up, void* out, int64_t begin, int64_t end) {
  elementwise<Io>(begin, end, [&](int64_t i, int n) {
    const bool whole = n == kWidth;
    const VecF a = whole ? Io::load(gate, i) : Io::load_partial(gate, i, n, 0.0f);
    const VecF b = whole ? Io::load(up, i) : Io::load_partial(up, i, n, 0.0f);
    // silu(a) is rounded to the storage dtype before the product, as silu(a) * up is
    // computed by two ops in eager (and by Inductor, which rounds the same way).
    VecF s = a / (1.0f + exp_vec(-a));
    if constexpr (std::is_same_v<Io, BFloat16Io>) s = (VecF)(float_to_bf16_lanes(s) << 16);
    const VecF y = s * b;
    if (whole) {
      Io::store(out, i, y);
    } else {
      Io::store_partial(out, i, n, y);
    }
  });
}

template <class Io>
void silu_mul_backward_range(const void* grad_out, const void* gate, const void* up,
                             void* grad_gate, void* grad_up, int64_t begin, int64_t end) {
  elementwise<Io>(begin, end, [&](int64_t i, int n) {
    const bool whole = n == kWidth;
    const VecF g = whole ? Io::load(grad_out, i) : Io::load_partial(grad_out, i, n, 0.0f);
    const VecF a = whole ? Io::load(gate, i) : Io::load_partial(gate, i, n, 0.0f);
    const VecF b = whole ? Io::load(up, i) : Io::load_partial(up, i, n, 0.0f);
    const VecF sig = sigmoid_vec(a);
    VecF silu_a = a * sig;
    VecF g_silu = g * b;  // the gradient reaching silu(gate), rounded as eager's mul result
    if constexpr (std::is_same_v<Io, BFloat16Io>) {
      silu_a = (VecF)(float_to_bf16_lanes(a / (1.0f + exp_vec(-a))) << 16);
      g_silu = (VecF)(float_to_bf16_lanes(g_silu) << 16);
    }
    const VecF da = g_silu * sig * (1.0f + a * (1.0f - sig));
    const VecF db = g * silu_a;
    if (whole) {
      Io::store(grad_gate, i, da);
      Io::store(grad_up, i, db);
    } else {
      Io::store_partial(grad_gate, i, n, da);
      Io::store_partial(grad_up, i, n, db);
    }
  });
}

void silu_mul(RowDtype dtype, const void* gate, const void* up, void* out, int64_t begin,
              int64_t end) {
  if (dtype == RowDtype::kFloat32) {
    silu_mul_range<Float32Io>(gate, up, out, begin, end);
  } else {
    silu_mul_range<BFloat16Io>(gate, up, out, begin, end);
  }
}

void silu_mul_backward(RowDtype dtype, const void* grad_out, const void* gate, const void* up,
                       void* grad_gate, void* grad_up, int64_t begin, int64_t end) {
  if (dtype == RowDtype::kFloat32) {
    silu_mul_backward_range<Float32Io>(grad_out, gate, up, grad_gate, grad_up, begin, end);
  } else {
    silu_mul_backward_range<BFloat16Io>(grad_out, gate, up, grad_gate, grad_up, begin, end);
  }
}

void softmax(RowDtype dtype, bool log, const void* in, void* out, int64_t row_begin,
             int64_t row_end, int64_t cols, int64_t row_stride) {
  auto rows = [&](auto row) {
    for (int64_t r = row_begin; r < row_end; ++r) row(in, out, r * row_stride, cols);
  };
  if (dtype == RowDtype::kFloat32) {
    log ? rows(softmax_row<Float32Io, true>) : rows(softmax_row<Float32Io, false>);
  } else {
    log ? rows(softmax_row<BFloat16Io, true>) : rows(softmax_row<BFloat16Io, false>);
  }
}

void softmax_backward(RowDtype dtype, bool log, const void* grad_out, const void* out,
                      void* grad_in, int64_t row_begin, int64_t row_end, int64_t cols,
                      int64_t row_stride) {
  auto rows = [&](auto row) {
    for (int64_t r = row_begin; r < row_end; ++r) row(grad_out, out, grad_in, r * row_stride, cols);
  };
  if (dtype == RowDtype::kFloat32) {
    log ? rows(softmax_backward_row<Float32Io, true>)
        : rows(softmax_backward_row<Float32Io, false>);
  } else {
    log ? rows(softmax_backward_row<BFloat16Io, true>)
        : rows(softmax_backward_row<BFloat16Io, false>);
  }
}

void silu(RowDtype dtype, const void* in, void* out, int64_t begin, int64_t end) {
  if (dtype == RowDtype::kFloat32) {
    silu_range<Float32Io>(in, out, begin, end);
  } else {
    silu_range<BFloat16Io>(in, out, begin, end);
  }
}

void silu_backward(RowDtype dtype, const void* grad_out, const void* in, void* grad_in,
                   int64_t begin, int64_t end) {
  if (dtype == RowDtype::kFloat32) {
    silu_backward_range<Float32Io>(grad_out, in, grad_in, begin, end);
  } else {
    silu_backward_range<BFloat16Io>(grad_out, in, grad_in, begin, end);
  }
}

}  // namespace

const RowKernels kRowKernels{&softmax,       &softmax_backward, &silu,
                             &silu_backward, &silu_mul,         &silu_mul_backward};

}  // namespace neuron::kernels::ROW_KERNELS_NAMESPACE
