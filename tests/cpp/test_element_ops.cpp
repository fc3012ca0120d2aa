// The collectives' element-wise reductions at every instruction-set level this host has,
// against references written here: plain C++ arithmetic for 32/64-bit types, and for 16-bit
// floats a nearest-value search over every finite value of the format (ties to even).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu_features.h"
#include "element_ops.h"

using neuron::kernels::IsaLevel;
using nrt::dist::combine_with;
using nrt::dist::ElementType;
using nrt::dist::ReduceOp;

namespace {

std::vector<IsaLevel> host_levels() {
  std::vector<IsaLevel> levels{IsaLevel::kScalar};
  const IsaLevel best = neuron::kernels::isa_level();
  if (best >= IsaLevel::kAvx2) levels.push_back(IsaLevel::kAvx2);
  if (best >= IsaLevel::kAvx512) levels.push_back(IsaLevel::kAvx512);
  return levels;
}

const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMax, ReduceOp::kMin};

template <class T>
T reference_float(T x, T y, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return x + y;
    case ReduceOp::kProduct:
      return x * y;
    case ReduceOp::kMax:
      return std::isnan(x) ? x : std::isnan(y) ? y : std::max(x, y);
    case ReduceOp::kMin:
      return std::isnan(x) ? x : std::isnan(y) ? y : std::min(x, y);
  }
  return 0;
}

// A 16-bit float format: decoded with ldexp, encoded by searching the nearest value.
struct HalfFormat {
  int mantissa_bits;           // bf16 7, fp16 10
  int bias;                    // bf16 127, fp16 15
  std::vector<double> finite;  // every non-negative finite value, by code (sorted)

  explicit HalfFormat(int mbits, int b) : mantissa_bits(mbits), bias(b) {
    const int exp_bits = 15 - mbits;
    const uint32_t max_code = ((1u << exp_bits) - 1) << mbits;  // first inf code
    for (uint32_t code = 0; code < max_code; ++code) finite.push_back(decode(code));
  }
  double decode(uint32_t code) const {
    const int exp_bits = 15 - mantissa_bits;
    const uint32_t mant = code & ((1u << mantissa_bits) - 1);
    const int exp = static_cast<int>((code >> mantissa_bits) & ((1u << exp_bits) - 1));
    const double sign = (code & 0x8000) ? -1.0 : 1.0;
    if (exp == (1 << exp_bits) - 1) {
      return mant ? std::numeric_limits<double>::quiet_NaN()
                  : sign * std::numeric_limits<double>::infinity();
    }
    if (exp == 0) return sign * std::ldexp(static_cast<double>(mant), 1 - bias - mantissa_bits);
    return sign * std::ldexp(static_cast<double>(mant + (1u << mantissa_bits)),
                             exp - bias - mantissa_bits);
  }
  uint16_t encode(double v) const {  // v not NaN
    const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
    const double a = std::fabs(v);
    const uint32_t inf = static_cast<uint32_t>(finite.size());
    const double top = finite.back(), ulp = top - finite[finite.size() - 2];
    if (a >= top + ulp / 2) return static_cast<uint16_t>(sign | inf);  // ties go to inf (even)
    const auto hi = std::lower_bound(finite.begin(), finite.end(), a);
    if (hi == finite.begin() || *hi == a)
      return static_cast<uint16_t>(sign | (hi - finite.begin()));
    const uint32_t up = static_cast<uint32_t>(hi - finite.begin()), down = up - 1;
    const double below = a - finite[down], above = finite[up] - a;
    const uint32_t code = below < above ? down : above < below ? up : (down % 2 == 0 ? down : up);
    return static_cast<uint16_t>(sign | code);
  }
};

void expect_half_matches(const HalfFormat& format, ElementType type) {
  std::mt19937 rng(7);
  const size_t n = 1000;  // not a multiple of the vector widths: tails too
  std::vector<uint16_t> a(n), b(n);
  for (size_t i = 0; i < n; ++i) {
    // any code but NaN: subnormals, infinities, every exponent
    do {
      a[i] = static_cast<uint16_t>(rng());
    } while (std::isnan(format.decode(a[i])));
    do {
      b[i] = static_cast<uint16_t>(rng());
    } while (std::isnan(format.decode(b[i])));
  }
  a[0] = type == ElementType::kBFloat16 ? 0x7FC0 : 0x7E00;  // NaN wins max/min
  for (IsaLevel level : host_levels()) {
    for (ReduceOp op : kOps) {
      std::vector<uint16_t> out(n);
      combine_with(level, out.data(), a.data(), b.data(), n, type, op);
      for (size_t i = 0; i < n; ++i) {
        // float32 arithmetic then one rounding, as the kernels do (via double: exact here)
        const float x = static_cast<float>(format.decode(a[i]));
        const float y = static_cast<float>(format.decode(b[i]));
        const float r = reference_float(x, y, op);
        if (std::isnan(r)) {
          ASSERT_TRUE(std::isnan(format.decode(out[i])))
              << "level " << neuron::kernels::isa_name(level) << " op "
              << nrt::dist::reduce_op_name(op) << " i " << i;
          continue;
        }
        ASSERT_EQ(out[i], format.encode(r))
            << nrt::dist::element_type_name(type) << " level " << neuron::kernels::isa_name(level)
            << " op " << nrt::dist::reduce_op_name(op) << " i " << i << ": " << x << ", " << y;
      }
    }
  }
}

template <class T>
void expect_float_matches(ElementType type) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<T> dist(-1e3, 1e3);
  const size_t n = 1001;
  std::vector<T> a(n), b(n);
  for (size_t i = 0; i < n; ++i) a[i] = dist(rng), b[i] = dist(rng);
  a[5] = std::numeric_limits<T>::quiet_NaN();
  b[6] = std::numeric_limits<T>::quiet_NaN();
  b[7] = std::numeric_limits<T>::denorm_min();
  for (IsaLevel level : host_levels()) {
    for (ReduceOp op : kOps) {
      std::vector<T> out(n), in_place = a;
      combine_with(level, out.data(), a.data(), b.data(), n, type, op);
      combine_with(level, in_place.data(), in_place.data(), b.data(), n, type, op);  // dst = a
      for (size_t i = 0; i < n; ++i) {
        const T r = reference_float(a[i], b[i], op);
        if (std::isnan(r)) {
          ASSERT_TRUE(std::isnan(out[i]) && std::isnan(in_place[i])) << i;
        } else {
          ASSERT_EQ(out[i], r) << "level " << neuron::kernels::isa_name(level) << " i " << i;
          ASSERT_EQ(in_place[i], r) << i;
        }
      }
    }
  }
}

template <class T>
void expect_integer_matches(ElementType type) {
  std::mt19937_64 rng(5);
  const size_t n = 999;
  std::vector<T> a(n), b(n);
  for (size_t i = 0; i < n; ++i) a[i] = static_cast<T>(rng()), b[i] = static_cast<T>(rng());
  a[0] = std::numeric_limits<T>::max(), b[0] = 1;  // wraps, as torch's integers do
  using U = std::make_unsigned_t<T>;
  for (IsaLevel level : host_levels()) {
    for (ReduceOp op : kOps) {
      std::vector<T> out = b;  // dst = b
      combine_with(level, out.data(), a.data(), out.data(), n, type, op);
      for (size_t i = 0; i < n; ++i) {
        const U x = static_cast<U>(a[i]), y = static_cast<U>(b[i]);
        const T r = op == ReduceOp::kSum       ? static_cast<T>(static_cast<U>(x + y))
                    : op == ReduceOp::kProduct ? static_cast<T>(static_cast<U>(x * y))
                    : op == ReduceOp::kMax     ? std::max(a[i], b[i])
                                               : std::min(a[i], b[i]);
        ASSERT_EQ(out[i], r) << "level " << neuron::kernels::isa_name(level) << " i " << i;
      }
    }
  }
}

}  // namespace

TEST(ElementOps, BFloat16EveryLevelRoundsToNearestEven) {
  expect_half_matches(HalfFormat(7, 127), ElementType::kBFloat16);
}

TEST(ElementOps, Float16EveryLevelRoundsToNearestEven) {
  expect_half_matches(HalfFormat(10, 15), ElementType::kFloat16);
}

TEST(ElementOps, FloatsEveryLevel) {
  expect_float_matches<float>(ElementType::kFloat32);
  expect_float_matches<double>(ElementType::kFloat64);
}

TEST(ElementOps, IntegersWrapEveryLevel) {
  expect_integer_matches<int8_t>(ElementType::kInt8);
  expect_integer_matches<uint8_t>(ElementType::kUInt8);
  expect_integer_matches<int32_t>(ElementType::kInt32);
  expect_integer_matches<int64_t>(ElementType::kInt64);
}

TEST(ElementOps, BoolIsLogical) {
  const uint8_t a[] = {0, 0, 1, 2}, b[] = {0, 3, 0, 1};
  for (IsaLevel level : host_levels()) {
    uint8_t any[4], all[4];
    combine_with(level, any, a, b, 4, ElementType::kBool, ReduceOp::kSum);
    combine_with(level, all, a, b, 4, ElementType::kBool, ReduceOp::kMin);
    EXPECT_EQ(std::vector<uint8_t>(any, any + 4), std::vector<uint8_t>({0, 1, 1, 1}));
    EXPECT_EQ(std::vector<uint8_t>(all, all + 4), std::vector<uint8_t>({0, 0, 0, 1}));
  }
}
