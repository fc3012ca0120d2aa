// Row kernels (csrc/kernels/row_kernels.h) at every instruction-set level the host has,
// against a double-precision reference computed from the same (rounded) inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cpu_features.h"
#include "row_kernels.h"

namespace nk = neuron::kernels;

namespace {

std::vector<nk::IsaLevel> host_levels() {
  std::vector<nk::IsaLevel> levels;
  for (int l = 0; l <= static_cast<int>(nk::isa_level()); ++l) {
    levels.push_back(static_cast<nk::IsaLevel>(l));
  }
  return levels;
}

uint16_t to_bf16(float f) {  // round to nearest even, as c10::BFloat16
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return 0x7fc0;
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Values in one dtype's storage, with their exact float values.
struct Buffer {
  nk::RowDtype dtype;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;

  Buffer(nk::RowDtype d, const std::vector<float>& values) : dtype(d) {
    if (d == nk::RowDtype::kFloat32) {
      f32 = values;
    } else {
      for (float v : values) bf16.push_back(to_bf16(v));
    }
  }
  Buffer(nk::RowDtype d, size_t n) : Buffer(d, std::vector<float>(n, 0.0f)) {}
  void* data() {
    return dtype == nk::RowDtype::kFloat32 ? static_cast<void*>(f32.data()) : bf16.data();
  }
  double at(size_t i) const {
    return dtype == nk::RowDtype::kFloat32 ? f32[i] : from_bf16(bf16[i]);
  }
};

// Tolerance: float32 results within a few ulps of float math; bfloat16 results within
// one bfloat16 rounding (2^-8 relative) of the exact value.
double tolerance(nk::RowDtype dtype, double ref, double scale) {
  if (dtype == nk::RowDtype::kFloat32) return 4e-6 * (std::fabs(ref) + scale);
  return std::ldexp(1.0, -8) * std::fabs(ref) + 1e-6 * scale;
}

std::vector<float> random_values(size_t n, float spread, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, spread);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

const char* dtype_name(nk::RowDtype d) {
  return d == nk::RowDtype::kFloat32 ? "float32" : "bfloat16";
}

class RowKernelsTest : public ::testing::TestWithParam<nk::RowDtype> {};

TEST_P(RowKernelsTest, SoftmaxAndLogSoftmaxMatchDoubleReference) {
  const nk::RowDtype dtype = GetParam();
  const int64_t rows = 3;
  for (int64_t cols : {1, 3, 4, 15, 16, 17, 33, 100, 8000}) {
    std::vector<float> values = random_values(rows * cols, 4.0f, static_cast<unsigned>(cols));
    // A masked entry (-inf) in every row but the first, as causal masks produce.
    for (int64_t r = 1; r < rows && cols > 1; ++r) {
      values[r * cols + (r % cols)] = -std::numeric_limits<float>::infinity();
    }
    Buffer in(dtype, values);
    for (bool log : {false, true}) {
      // Reference from the stored (rounded) inputs.
      std::vector<double> ref(rows * cols);
      for (int64_t r = 0; r < rows; ++r) {
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < cols; ++j) mx = std::max(mx, in.at(r * cols + j));
        for (int64_t j = 0; j < cols; ++j) sum += std::exp(in.at(r * cols + j) - mx);
        for (int64_t j = 0; j < cols; ++j) {
          const double x = in.at(r * cols + j) - mx;
          ref[r * cols + j] = log ? x - std::log(sum) : std::exp(x) / sum;
        }
      }
      for (nk::IsaLevel level : host_levels()) {
        SCOPED_TRACE(std::string(nk::isa_name(level)) + " " + dtype_name(dtype) +
                     (log ? " log_softmax" : " softmax") + " cols=" + std::to_string(cols));
        Buffer out(dtype, rows * cols);
        nk::row_kernels_for(level).softmax(dtype, log, in.data(), out.data(), 0, rows, cols, cols);
        for (int64_t i = 0; i < rows * cols; ++i) {
          if (std::isinf(ref[i])) {
            ASSERT_EQ(out.at(i), ref[i]) << "at " << i;
          } else {
            ASSERT_NEAR(out.at(i), ref[i], tolerance(dtype, ref[i], log ? 1.0 : 1e-3))
                << "at " << i;
          }
        }
      }
    }
  }
}

TEST_P(RowKernelsTest, SoftmaxBackwardMatchesDoubleReference) {
  const nk::RowDtype dtype = GetParam();
  const int64_t rows = 2;
  for (int64_t cols : {1, 7, 16, 31, 1000}) {
    for (bool log : {false, true}) {
      // A valid forward output: softmax or log_softmax of random logits.
      std::vector<float> logits = random_values(rows * cols, 2.0f, 7u + cols);
      std::vector<float> y(rows * cols);
      for (int64_t r = 0; r < rows; ++r) {
        double mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j < cols; ++j) mx = std::max<double>(mx, logits[r * cols + j]);
        for (int64_t j = 0; j < cols; ++j) sum += std::exp(logits[r * cols + j] - mx);
        for (int64_t j = 0; j < cols; ++j) {
          const double x = logits[r * cols + j] - mx;
          y[r * cols + j] = static_cast<float>(log ? x - std::log(sum) : std::exp(x) / sum);
        }
      }
      Buffer out(dtype, y), grad(dtype, random_values(rows * cols, 1.0f, 99u + cols));
      std::vector<double> ref(rows * cols);
      for (int64_t r = 0; r < rows; ++r) {
        double total = 0;
        for (int64_t j = 0; j < cols; ++j) {
          total += log ? grad.at(r * cols + j) : grad.at(r * cols + j) * out.at(r * cols + j);
        }
        for (int64_t j = 0; j < cols; ++j) {
          const double g = grad.at(r * cols + j), o = out.at(r * cols + j);
          ref[r * cols + j] = log ? g - std::exp(o) * total : o * (g - total);
        }
      }
      for (nk::IsaLevel level : host_levels()) {
        SCOPED_TRACE(std::string(nk::isa_name(level)) + " " + dtype_name(dtype) +
                     (log ? " log_softmax" : " softmax") +
                     " backward cols=" + std::to_string(cols));
        Buffer grad_in(dtype, rows * cols);
        nk::row_kernels_for(level).softmax_backward(dtype, log, grad.data(), out.data(),
                                                    grad_in.data(), 0, rows, cols, cols);
        for (int64_t i = 0; i < rows * cols; ++i) {
          // Cancellation (g - total) makes the error relative to the terms, not the result.
          ASSERT_NEAR(grad_in.at(i), ref[i], tolerance(dtype, ref[i], 1.0) * 4) << "at " << i;
        }
      }
    }
  }
}

TEST_P(RowKernelsTest, SiluAndBackwardMatchDoubleReference) {
  const nk::RowDtype dtype = GetParam();
  for (int64_t n : {1, 5, 16, 37, 4099}) {
    std::vector<float> values = random_values(n, 6.0f, 3u + n);
    values[0] = -100.0f;  // exp(-x) beyond float range
    Buffer x(dtype, values), g(dtype, random_values(n, 1.0f, 5u + n));
    for (nk::IsaLevel level : host_levels()) {
      SCOPED_TRACE(std::string(nk::isa_name(level)) + " " + dtype_name(dtype) +
                   " n=" + std::to_string(n));
      Buffer y(dtype, n), dx(dtype, n);
      // An offset range: the kernels index from `begin`, not from 0.
      nk::row_kernels_for(level).silu(dtype, x.data(), y.data(), 0, 1);
      nk::row_kernels_for(level).silu(dtype, x.data(), y.data(), 1, n);
      nk::row_kernels_for(level).silu_backward(dtype, g.data(), x.data(), dx.data(), 0, n);
      for (int64_t i = 0; i < n; ++i) {
        const double xi = x.at(i), s = 1.0 / (1.0 + std::exp(-xi));
        const double ref_y = xi * s, ref_dx = g.at(i) * s * (1.0 + xi * (1.0 - s));
        ASSERT_NEAR(y.at(i), ref_y, tolerance(dtype, ref_y, 1e-6)) << "at " << i;
        // 1 + x (1 - s) cancels near x = -1.28: the error scales with the terms' size.
        // Below x = -88 exp(-x) is clamped: results ~1e-37 instead of ~1e-42 (floor 1e-30).
        const double terms = std::fabs(g.at(i) * s) * (1.0 + std::fabs(xi)) + 1e-30;
        ASSERT_NEAR(dx.at(i), ref_dx, tolerance(dtype, ref_dx, terms)) << "at " << i;
      }
    }
  }
}

TEST_P(RowKernelsTest, SiluMulAndBackwardMatchDoubleReference) {
  const nk::RowDtype dtype = GetParam();
  for (int64_t n : {1, 9, 16, 33, 2051}) {
    Buffer a(dtype, random_values(n, 5.0f, 11u + n)), b(dtype, random_values(n, 2.0f, 13u + n));
    Buffer g(dtype, random_values(n, 1.0f, 17u + n));
    for (nk::IsaLevel level : host_levels()) {
      SCOPED_TRACE(std::string(nk::isa_name(level)) + " " + dtype_name(dtype) +
                   " n=" + std::to_string(n));
      Buffer y(dtype, n), da(dtype, n), db(dtype, n);
      nk::row_kernels_for(level).silu_mul(dtype, a.data(), b.data(), y.data(), 0, n);
      nk::row_kernels_for(level).silu_mul_backward(dtype, g.data(), a.data(), b.data(), da.data(),
                                                   db.data(), 0, n);
      // bfloat16: silu(a) and g * b are rounded once more in the middle (as eager's two ops),
      // so allow two roundings.
      const double rounds = dtype == nk::RowDtype::kFloat32 ? 1.0 : 2.0;
      for (int64_t i = 0; i < n; ++i) {
        const double x = a.at(i), s = 1.0 / (1.0 + std::exp(-x));
        const double ref_y = x * s * b.at(i);
        const double ref_da = g.at(i) * b.at(i) * s * (1.0 + x * (1.0 - s));
        const double ref_db = g.at(i) * x * s;
        const double terms = std::fabs(g.at(i) * b.at(i) * s) * (1.0 + std::fabs(x)) + 1e-30;
        ASSERT_NEAR(y.at(i), ref_y, rounds * tolerance(dtype, ref_y, 1e-6)) << "at " << i;
        ASSERT_NEAR(da.at(i), ref_da, rounds * tolerance(dtype, ref_da, terms)) << "at " << i;
        ASSERT_NEAR(db.at(i), ref_db, rounds * tolerance(dtype, ref_db, 1e-6)) << "at " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, RowKernelsTest,
                         ::testing::Values(nk::RowDtype::kFloat32, nk::RowDtype::kBFloat16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(RowKernels, EveryLevelBelowTheHostsIsTested) {
  // The suite runs each level up to isa_level(); on this project's AVX-512 hosts that is
  // all three implementations (baseline, AVX2, AVX-512).
  EXPECT_GE(host_levels().size(), 1u);
  EXPECT_EQ(&nk::row_kernels(), &nk::row_kernels_for(nk::isa_level()));
}

}  // namespace
