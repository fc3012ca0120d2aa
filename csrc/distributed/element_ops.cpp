#include "element_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace nrt::dist {
namespace {

template <class T>
T combine(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return static_cast<T>(a + b);
    case ReduceOp::kProduct:
      return static_cast<T>(a * b);
    case ReduceOp::kMax:
      return std::max(a, b);
    case ReduceOp::kMin:
      return std::min(a, b);
  }
  throw std::invalid_argument("unknown reduce op");
}

template <class T>
void reduce_typed(void* dst, const void* src, size_t count, ReduceOp op) {
  auto* d = static_cast<T*>(dst);
  const auto* s = static_cast<const T*>(src);
  for (size_t i = 0; i < count; ++i) d[i] = combine(d[i], s[i], op);
}

// NaN wins max/min, as torch.maximum does.
template <>
void reduce_typed<float>(void* dst, const void* src, size_t count, ReduceOp op) {
  auto* d = static_cast<float*>(dst);
  const auto* s = static_cast<const float*>(src);
  for (size_t i = 0; i < count; ++i) {
    if ((op == ReduceOp::kMax || op == ReduceOp::kMin) && (std::isnan(d[i]) || std::isnan(s[i]))) {
      d[i] = std::isnan(d[i]) ? d[i] : s[i];
    } else {
      d[i] = combine(d[i], s[i], op);
    }
  }
}

float bf16_to_float(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if (std::isnan(f)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7FFF + ((bits >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

float f16_to_float(uint16_t h) {
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

uint16_t float_to_f16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t abs = bits & 0x7FFFFFFF;
  if (abs >= 0x7F800000) return sign | (abs > 0x7F800000 ? 0x7E00 : 0x7C00);  // NaN / inf
  if (abs >= 0x477FF000) return sign | 0x7C00;                                // overflow
  if (abs < 0x38800000) {                                                     // subnormal
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

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void reduce_half(void* dst, const void* src, size_t count, ReduceOp op) {
  auto* d = static_cast<uint16_t*>(dst);
  const auto* s = static_cast<const uint16_t*>(src);
  for (size_t i = 0; i < count; ++i) {
    float a = ToFloat(d[i]);
    const float b = ToFloat(s[i]);
    reduce_typed<float>(&a, &b, 1, op);
    d[i] = FromFloat(a);
  }
}

}  // namespace

size_t element_size(ElementType type) {
  switch (type) {
    case ElementType::kFloat64:
    case ElementType::kInt64:
      return 8;
    case ElementType::kFloat32:
    case ElementType::kInt32:
      return 4;
    case ElementType::kBFloat16:
    case ElementType::kFloat16:
      return 2;
    case ElementType::kInt8:
    case ElementType::kUInt8:
    case ElementType::kBool:
      return 1;
  }
  throw std::invalid_argument("unknown element type");
}

const char* element_type_name(ElementType type) {
  static const char* const names[] = {"float32", "float64", "bfloat16", "float16", "int8",
                                      "uint8",   "int32",   "int64",    "bool"};
  return names[static_cast<size_t>(type)];
}

const char* reduce_op_name(ReduceOp op) {
  static const char* const names[] = {"SUM", "PRODUCT", "MAX", "MIN"};
  return names[static_cast<size_t>(op)];
}

void reduce_into(void* dst, const void* src, size_t count, ElementType type, ReduceOp op) {
  switch (type) {
    case ElementType::kFloat32:
      return reduce_typed<float>(dst, src, count, op);
    case ElementType::kFloat64:
      return reduce_typed<double>(dst, src, count, op);
    case ElementType::kBFloat16:
      return reduce_half<bf16_to_float, float_to_bf16>(dst, src, count, op);
    case ElementType::kFloat16:
      return reduce_half<f16_to_float, float_to_f16>(dst, src, count, op);
    case ElementType::kInt8:
      return reduce_typed<int8_t>(dst, src, count, op);
    case ElementType::kUInt8:
      return reduce_typed<uint8_t>(dst, src, count, op);
    case ElementType::kInt32:
      return reduce_typed<int32_t>(dst, src, count, op);
    case ElementType::kInt64:
      return reduce_typed<int64_t>(dst, src, count, op);
    case ElementType::kBool:
      // SUM/MAX are logical or, PRODUCT/MIN logical and, as in torch.distributed.
      {
        auto* d = static_cast<uint8_t*>(dst);
        const auto* s = static_cast<const uint8_t*>(src);
        const bool any = op == ReduceOp::kSum || op == ReduceOp::kMax;
        for (size_t i = 0; i < count; ++i) d[i] = any ? (d[i] || s[i]) : (d[i] && s[i]);
        return;
      }
  }
  throw std::invalid_argument("unknown element type");
}

}  // namespace nrt::dist
