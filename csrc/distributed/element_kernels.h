// The element-wise reductions, as templates compiled once per instruction set: included by
// element_ops.cpp (portable), element_ops.avx2.cpp and element_ops.avx512.cpp, each with its
// own compiler flags. Everything here has internal linkage (an anonymous namespace), so the
// linker can never pick one file's AVX-512 copy of a template for another's portable caller.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <type_traits>

#include "element_ops.h"

namespace nrt::dist {
namespace {

// The loops below are written so that -O3 vectorises them: the op is a template argument
// (no switch inside the loop), selects instead of branches, and __restrict pointers for
// each aliasing case the collectives use (dst is a, b, or neither).
template <class T, class F>
void apply(T* dst, const T* a, const T* b, size_t count, F f) {
  if (dst == a) {
    T* __restrict d = dst;
    const T* __restrict s = b;
    for (size_t i = 0; i < count; ++i) d[i] = f(d[i], s[i]);
  } else if (dst == b) {
    T* __restrict d = dst;
    const T* __restrict s = a;
    for (size_t i = 0; i < count; ++i) d[i] = f(s[i], d[i]);
  } else {
    T* __restrict d = dst;
    const T* __restrict x = a;
    const T* __restrict y = b;
    for (size_t i = 0; i < count; ++i) d[i] = f(x[i], y[i]);
  }
}

// Integers wrap, as torch's do: the arithmetic is done unsigned (defined overflow).
template <class T>
void combine_integer(T* dst, const T* a, const T* b, size_t count, ReduceOp op) {
  using U = std::make_unsigned_t<T>;
  switch (op) {
    case ReduceOp::kSum:
      return apply(dst, a, b, count,
                   [](T x, T y) { return static_cast<T>(static_cast<U>(x) + static_cast<U>(y)); });
    case ReduceOp::kProduct:
      return apply(dst, a, b, count, [](T x, T y) {
        return static_cast<T>(static_cast<U>(static_cast<U>(x) * static_cast<U>(y)));
      });
    case ReduceOp::kMax:
      return apply(dst, a, b, count, [](T x, T y) { return x < y ? y : x; });
    case ReduceOp::kMin:
      return apply(dst, a, b, count, [](T x, T y) { return y < x ? y : x; });
  }
  throw std::invalid_argument("unknown reduce op");
}

// NaN wins max/min (the first operand's NaN if both are), as torch.maximum does.
template <class T>
T max_nan(T x, T y) {
  T r = x < y ? y : x;
  r = y != y ? y : r;
  return x != x ? x : r;
}

template <class T>
T min_nan(T x, T y) {
  T r = y < x ? y : x;
  r = y != y ? y : r;
  return x != x ? x : r;
}

template <class T>
void combine_float(T* dst, const T* a, const T* b, size_t count, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return apply(dst, a, b, count, [](T x, T y) { return x + y; });
    case ReduceOp::kProduct:
      return apply(dst, a, b, count, [](T x, T y) { return x * y; });
    case ReduceOp::kMax:
      return apply(dst, a, b, count, [](T x, T y) { return max_nan(x, y); });
    case ReduceOp::kMin:
      return apply(dst, a, b, count, [](T x, T y) { return min_nan(x, y); });
  }
  throw std::invalid_argument("unknown reduce op");
}

inline float scalar_bf16_to_float(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t scalar_float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const uint32_t rounded = bits + 0x7FFF + ((bits >> 16) & 1);  // round to nearest even
  const uint32_t quiet_nan = bits | 0x400000;                   // NaN stays NaN
  return static_cast<uint16_t>((f != f ? quiet_nan : rounded) >> 16);
}

inline float scalar_f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3FF) << 13);
    }
  } else if (exp == 0x1F) {
    bits = sign | 0x7F800000 | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t scalar_float_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t abs = bits & 0x7FFFFFFF;
  if (abs > 0x7F800000) return sign | 0x7E00 | ((abs >> 13) & 0x3FF);  // NaN, as F16C
  if (abs == 0x7F800000) return sign | 0x7C00;                         // inf
  if (abs >= 0x477FF000) return sign | 0x7C00;                         // overflow
  if (abs < 0x38800000) {                                              // subnormal
    if (abs < 0x33000000) return sign;
    const uint32_t exp = abs >> 23;
    const uint32_t mant = (abs & 0x7FFFFF) | 0x800000;
    const uint32_t shift = 126 - exp;
    uint32_t half = mant >> shift;
    const uint32_t rest = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1))) ++half;
    return sign | static_cast<uint16_t>(half);
  }
  uint32_t half = ((abs >> 13) - ((127 - 15) << 10));
  const uint32_t rest = abs & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) ++half;
  return sign | static_cast<uint16_t>(half);
}

// 16-bit floats in blocks: convert both operands to float32 (Codec's block converters, with
// the widest instructions of the file's ISA), combine in float32, round back.
template <class Codec, bool kBf16>
void combine_half(uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t count, ReduceOp op) {
  constexpr size_t kBlock = 256;
  alignas(64) float x[kBlock];
  alignas(64) float y[kBlock];
  for (size_t done = 0; done < count; done += kBlock) {
    const size_t n = count - done < kBlock ? count - done : kBlock;
    if (kBf16) {
      Codec::bf16_to_float(x, a + done, n);
      Codec::bf16_to_float(y, b + done, n);
    } else {
      Codec::f16_to_float(x, a + done, n);
      Codec::f16_to_float(y, b + done, n);
    }
    combine_float(x, x, y, n, op);
    if (kBf16) {
      Codec::float_to_bf16(dst + done, x, n);
    } else {
      Codec::float_to_f16(dst + done, x, n);
    }
  }
}

// Block converters one element at a time: the portable codec, and every codec's tail.
struct ScalarCodec {
  static void bf16_to_float(float* out, const uint16_t* in, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = scalar_bf16_to_float(in[i]);
  }
  static void float_to_bf16(uint16_t* out, const float* in, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = scalar_float_to_bf16(in[i]);
  }
  static void f16_to_float(float* out, const uint16_t* in, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = scalar_f16_to_float(in[i]);
  }
  static void float_to_f16(uint16_t* out, const float* in, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = scalar_float_to_f16(in[i]);
  }
};

// SUM/MAX are logical or, PRODUCT/MIN logical and, as in torch.distributed.
inline void combine_bool(uint8_t* dst, const uint8_t* a, const uint8_t* b, size_t count,
                         ReduceOp op) {
  if (op == ReduceOp::kSum || op == ReduceOp::kMax) {
    return apply(dst, a, b, count,
                 [](uint8_t x, uint8_t y) { return static_cast<uint8_t>((x != 0) | (y != 0)); });
  }
  apply(dst, a, b, count,
        [](uint8_t x, uint8_t y) { return static_cast<uint8_t>((x != 0) & (y != 0)); });
}

template <class Codec>
void combine_all(void* dst, const void* a, const void* b, size_t count, ElementType type,
                 ReduceOp op) {
  switch (type) {
    case ElementType::kFloat32:
      return combine_float(static_cast<float*>(dst), static_cast<const float*>(a),
                           static_cast<const float*>(b), count, op);
    case ElementType::kFloat64:
      return combine_float(static_cast<double*>(dst), static_cast<const double*>(a),
                           static_cast<const double*>(b), count, op);
    case ElementType::kBFloat16:
      return combine_half<Codec, true>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(a),
                                       static_cast<const uint16_t*>(b), count, op);
    case ElementType::kFloat16:
      return combine_half<Codec, false>(static_cast<uint16_t*>(dst),
                                        static_cast<const uint16_t*>(a),
                                        static_cast<const uint16_t*>(b), count, op);
    case ElementType::kInt8:
      return combine_integer(static_cast<int8_t*>(dst), static_cast<const int8_t*>(a),
                             static_cast<const int8_t*>(b), count, op);
    case ElementType::kUInt8:
      return combine_integer(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(a),
                             static_cast<const uint8_t*>(b), count, op);
    case ElementType::kInt32:
      return combine_integer(static_cast<int32_t*>(dst), static_cast<const int32_t*>(a),
                             static_cast<const int32_t*>(b), count, op);
    case ElementType::kInt64:
      return combine_integer(static_cast<int64_t*>(dst), static_cast<const int64_t*>(a),
                             static_cast<const int64_t*>(b), count, op);
    case ElementType::kBool:
      return combine_bool(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(a),
                          static_cast<const uint8_t*>(b), count, op);
  }
  throw std::invalid_argument("unknown element type");
}

}  // namespace
}  // namespace nrt::dist
