// gemm() at every instruction-set level the host has, against a double-precision reference:
// odd sizes, m = 1 (GEMV), k not a multiple of the vector width, the three transposes of a
// linear layer, batches, broadcast bias, float32 and bfloat16, serial and threaded.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cpu_features.h"
#include "gemm.h"

namespace nk = neuron::kernels;

namespace {

std::vector<nk::IsaLevel> host_levels() {
  std::vector<nk::IsaLevel> levels{nk::IsaLevel::kScalar};
  const auto& f = nk::cpu_features();
  if (f.avx2) levels.push_back(nk::IsaLevel::kAvx2);
  if (f.avx512) levels.push_back(nk::IsaLevel::kAvx512);
  if (f.avx512_bf16) levels.push_back(nk::IsaLevel::kAvx512Bf16);
  return levels;
}

// Splits tasks over real threads, as at::parallel_for would.
nk::ParallelFor thread_for(int threads) {
  nk::ParallelFor par;
  par.threads = threads;
  par.run = [threads](int64_t tasks, const std::function<void(int64_t, int64_t)>& body) {
    std::vector<std::thread> pool;
    const int64_t per = (tasks + threads - 1) / threads;
    for (int64_t b = 0; b < tasks; b += per) pool.emplace_back(body, b, std::min(tasks, b + per));
    for (auto& t : pool) t.join();
  };
  return par;
}

enum class Layout { kRowMajor, kTransposed };

struct Case {
  int64_t batch, m, n, k;
  Layout a_layout, b_layout;
  bool bias;  // a row-broadcast bias (stride 0 across rows), as addmm's bias is
  float alpha, beta;
};

std::string describe(const Case& c, nk::GemmDtype dtype, nk::IsaLevel level) {
  return std::string(nk::isa_name(level)) + (dtype == nk::GemmDtype::kFloat32 ? " f32" : " bf16") +
         " b=" + std::to_string(c.batch) + " m=" + std::to_string(c.m) +
         " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) +
         " aT=" + std::to_string(c.a_layout == Layout::kTransposed) +
         " bT=" + std::to_string(c.b_layout == Layout::kTransposed) +
         " bias=" + std::to_string(c.bias);
}

// One case's operands (random values in [-1, 1), bf16-rounded for bf16) and its problem,
// writing into an output whose row stride is wider than n and whose padding is NaN.
struct CaseData {
  std::vector<float> a, b, bias, c32;
  std::vector<uint16_t> a16, b16, bias16, c16;
  int64_t ldc = 0;
  nk::GemmProblem problem;

  CaseData(const Case& c, nk::GemmDtype dtype) {
    std::mt19937 rng(static_cast<unsigned>(c.m * 131 + c.n * 7 + c.k));
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    const bool bf16 = dtype == nk::GemmDtype::kBFloat16;
    auto quantize = [&](float v) { return bf16 ? nk::bf16_to_float(nk::float_to_bf16_rne(v)) : v; };
    a.resize(c.batch * c.m * c.k);
    b.resize(c.batch * c.k * c.n);
    bias.resize(c.batch * c.n);
    for (auto& v : a) v = quantize(dist(rng));
    for (auto& v : b) v = quantize(dist(rng));
    for (auto& v : bias) v = quantize(dist(rng));
    auto to_bf16 = [](const std::vector<float>& from) {
      std::vector<uint16_t> to(from.size());
      for (size_t i = 0; i < from.size(); ++i) to[i] = nk::float_to_bf16_rne(from[i]);
      return to;
    };
    a16 = to_bf16(a);
    b16 = to_bf16(b);
    bias16 = to_bf16(bias);
    ldc = c.n + 3;
    c32.assign(c.batch * c.m * ldc, NAN);
    c16.assign(c.batch * c.m * ldc, 0x7fc0);
    // Storage: A as m×k row-major or k×m (transposed view); B likewise.
    const bool at = c.a_layout == Layout::kTransposed, bt = c.b_layout == Layout::kTransposed;
    nk::GemmProblem& p = problem;
    p.batch = c.batch;
    p.m = c.m;
    p.n = c.n;
    p.k = c.k;
    p.dtype = dtype;
    p.a = {bf16 ? static_cast<const void*>(a16.data()) : a.data(), at ? 1 : c.k, at ? c.m : 1,
           c.m * c.k};
    p.b = {bf16 ? static_cast<const void*>(b16.data()) : b.data(), bt ? 1 : c.n, bt ? c.k : 1,
           c.k * c.n};
    if (c.bias) p.bias = {bf16 ? static_cast<const void*>(bias16.data()) : bias.data(), 0, 1, c.n};
    p.c = bf16 ? static_cast<void*>(c16.data()) : c32.data();
    p.c_row_stride = ldc;
    p.c_batch_stride = c.m * ldc;
    p.alpha = c.alpha;
    p.beta = c.beta;
  }
};

// Runs one case and checks every element against the double reference computed from the
// values actually stored (bf16-rounded inputs for bf16). Tolerance: float32 accumulation
// error 1e-5 of Σ|a·b| (k ≤ 600 terms); bf16 output adds its rounding, 2^-8 relative.
void run_case(const Case& c, nk::GemmDtype dtype, nk::IsaLevel level, const nk::ParallelFor& par) {
  CaseData data(c, dtype);
  nk::gemm(data.problem, par, level);
  const bool bf16 = dtype == nk::GemmDtype::kBFloat16;
  const bool at = c.a_layout == Layout::kTransposed, bt = c.b_layout == Layout::kTransposed;
  auto a_at = [&](int64_t bi, int64_t i, int64_t k) {
    return data.a[bi * c.m * c.k + (at ? k * c.m + i : i * c.k + k)];
  };
  auto b_at = [&](int64_t bi, int64_t k, int64_t j) {
    return data.b[bi * c.k * c.n + (bt ? j * c.k + k : k * c.n + j)];
  };
  const std::vector<float>& bias = data.bias;
  const std::vector<float>& c32 = data.c32;
  const std::vector<uint16_t>& c16 = data.c16;
  const int64_t ldc = data.ldc;

  const std::string what = describe(c, dtype, level);
  int64_t bad = 0;
  for (int64_t bi = 0; bi < c.batch; ++bi) {
    for (int64_t i = 0; i < c.m; ++i) {
      for (int64_t j = 0; j < c.n; ++j) {
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < c.k; ++k) {
          const double t = double(a_at(bi, i, k)) * double(b_at(bi, k, j));
          ref += t;
          mag += std::fabs(t);
        }
        ref *= c.alpha;
        mag *= std::fabs(c.alpha);
        if (c.bias) {
          ref += double(c.beta) * bias[bi * c.n + j];
          mag += std::fabs(double(c.beta) * bias[bi * c.n + j]);
        }
        const int64_t at_c = bi * c.m * ldc + i * ldc + j;
        const double got = bf16 ? nk::bf16_to_float(c16[at_c]) : c32[at_c];
        const double tol = 1e-5 * mag + 1e-6 + (bf16 ? std::fabs(ref) / 256.0 : 0.0);
        if (!(std::fabs(got - ref) <= tol) && bad++ < 5) {
          ADD_FAILURE() << what << " at (" << bi << "," << i << "," << j << "): got " << got
                        << " want " << ref << " tol " << tol;
        }
      }
      // Padding columns between n and the row stride stay untouched.
      const int64_t pad = bi * c.m * ldc + i * ldc + c.n;
      if (bf16) {
        EXPECT_EQ(c16[pad], 0x7fc0) << what;
      } else {
        EXPECT_TRUE(std::isnan(c32[pad])) << what;
      }
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  const int64_t shapes[][3] = {
      {1, 1, 1},
      {1, 37, 19},
      {1, 64, 768},
      {2, 33, 17},
      {3, 5, 40},
      {4, 130, 33},
      {8, 9, 600},
      {9, 71, 300},
      {17, 3, 257},
      {67, 45, 31},
      {40, 96, 70},
      {130, 290, 270},
      {5, 0, 3},
      {6, 7, 0},
      {64, 1, 1024},
      {70, 3, 90},
      {6, 20, 45},
      // n within one AVX-512 vector (one-vector tiles) and just beyond it; k over KC
      {50, 12, 70},
      {33, 16, 300},
      {40, 24, 20}};
  for (const auto& s : shapes) {
    for (Layout al : {Layout::kRowMajor, Layout::kTransposed}) {
      for (Layout bl : {Layout::kRowMajor, Layout::kTransposed}) {
        out.push_back({1, s[0], s[1], s[2], al, bl, false, 1.0f, 1.0f});
      }
    }
    out.push_back({1, s[0], s[1], s[2], Layout::kRowMajor, Layout::kTransposed, true, 1.0f, 1.0f});
  }
  out.push_back({3, 5, 33, 70, Layout::kRowMajor, Layout::kRowMajor, false, 1.0f, 1.0f});
  out.push_back({2, 1, 40, 50, Layout::kRowMajor, Layout::kTransposed, true, 0.5f, 2.0f});
  out.push_back({2, 70, 40, 50, Layout::kTransposed, Layout::kRowMajor, true, -1.5f, 0.25f});
  // whole register tiles accumulated in the output over several k slices, then scaled
  out.push_back({1, 96, 64, 300, Layout::kRowMajor, Layout::kRowMajor, true, 0.5f, -2.0f});
  return out;
}

}  // namespace

TEST(Gemm, MatchesDoubleReferenceAtEveryLevel) {
  const nk::ParallelFor serial = nk::serial_for();
  for (nk::IsaLevel level : host_levels()) {
    for (nk::GemmDtype dtype : {nk::GemmDtype::kFloat32, nk::GemmDtype::kBFloat16}) {
      for (const Case& c : cases()) run_case(c, dtype, level, serial);
    }
  }
}

TEST(Gemm, ThreadedSplitMatches) {
  const nk::ParallelFor threads = thread_for(3);
  for (nk::IsaLevel level : host_levels()) {
    for (nk::GemmDtype dtype : {nk::GemmDtype::kFloat32, nk::GemmDtype::kBFloat16}) {
      run_case({1, 1, 1000, 300, Layout::kRowMajor, Layout::kTransposed, true, 1, 1}, dtype, level,
               threads);
      run_case({2, 300, 600, 100, Layout::kRowMajor, Layout::kRowMajor, false, 1, 1}, dtype, level,
               threads);
    }
  }
}

// Threads that share a product take narrower tiles (enough tiles for every thread to get
// several), which must not change a single bit: each element's k order is the tile's
// regardless of its shape. Shapes where the split halves columns (64 rows), rows (few
// columns), both, columns until it can split no further, and nothing (too small), each in
// every layout (which decides what may be halved), at 2 and 3 threads.
TEST(Gemm, SharedSplitGivesTheSerialBits) {
  const int64_t shapes[][3] = {
      {64, 256, 300}, {512, 48, 70}, {100, 300, 50}, {20, 200, 90}, {13, 20, 33}};
  for (nk::IsaLevel level : host_levels()) {
    for (nk::GemmDtype dtype : {nk::GemmDtype::kFloat32, nk::GemmDtype::kBFloat16}) {
      for (const auto& s : shapes) {
        for (Layout al : {Layout::kRowMajor, Layout::kTransposed}) {
          for (Layout bl : {Layout::kRowMajor, Layout::kTransposed}) {
            const Case c{1, s[0], s[1], s[2], al, bl, true, 1.0f, 1.0f};
            CaseData serial(c, dtype);
            nk::gemm(serial.problem, nk::serial_for(), level);
            for (int threads : {2, 3}) {
              CaseData shared(c, dtype);
              nk::gemm(shared.problem, thread_for(threads), level);
              const std::string what =
                  describe(c, dtype, level) + " threads=" + std::to_string(threads);
              if (dtype == nk::GemmDtype::kFloat32) {
                ASSERT_EQ(0, std::memcmp(serial.c32.data(), shared.c32.data(),
                                         serial.c32.size() * sizeof(float)))
                    << what;
              } else {
                ASSERT_EQ(serial.c16, shared.c16) << what;
              }
            }
          }
        }
      }
    }
  }
}

// A one-row GEMV takes several weight rows at a time (four for bf16 without bf16
// instructions), grouped within each thread's columns: every output element must have the
// bits it has computed alone (n = 1), serially and at 2 and 3 threads. 37 columns leave
// leftovers after the groups; k = 300 leaves a tail after the whole vectors.
TEST(Gemm, GemvColumnBitsDoNotDependOnTheirGrouping) {
  const Case c{1, 1, 37, 300, Layout::kRowMajor, Layout::kTransposed, true, 1.0f, 1.0f};
  for (nk::IsaLevel level : host_levels()) {
    for (nk::GemmDtype dtype : {nk::GemmDtype::kFloat32, nk::GemmDtype::kBFloat16}) {
      const bool bf16 = dtype == nk::GemmDtype::kBFloat16;
      const size_t element = bf16 ? sizeof(uint16_t) : sizeof(float);
      for (int threads : {1, 2, 3}) {
        CaseData all(c, dtype);
        nk::gemm(all.problem, threads == 1 ? nk::serial_for() : thread_for(threads), level);
        for (int64_t j = 0; j < c.n; ++j) {
          CaseData one(c, dtype);
          nk::GemmProblem p = one.problem;
          p.n = 1;
          p.b.data = static_cast<const char*>(p.b.data) + j * c.k * element;
          p.bias.data = static_cast<const char*>(p.bias.data) + j * element;
          nk::gemm(p, nk::serial_for(), level);
          const std::string what = describe(c, dtype, level) +
                                   " threads=" + std::to_string(threads) + " column " +
                                   std::to_string(j);
          if (bf16) {
            ASSERT_EQ(one.c16[0], all.c16[j]) << what;
          } else {
            ASSERT_EQ(0, std::memcmp(&one.c32[0], &all.c32[j], sizeof(float))) << what;
          }
        }
      }
    }
  }
}

TEST(Gemm, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to the even (1).
  EXPECT_EQ(nk::float_to_bf16_rne(1.0f + 1.0f / 256), 0x3f80);
  // 1 + 3·2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: goes up to the even.
  EXPECT_EQ(nk::float_to_bf16_rne(1.0f + 3.0f / 256), 0x3f82);
  EXPECT_EQ(nk::float_to_bf16_rne(1.0f + 1.0f / 256 + 1.0f / 4096), 0x3f81);
  EXPECT_EQ(nk::float_to_bf16_rne(NAN), 0x7fc0);
  EXPECT_EQ(nk::float_to_bf16_rne(INFINITY), 0x7f80);
  EXPECT_EQ(nk::float_to_bf16_rne(-0.0f), 0x8000);
}

// Each output element is the float32 sum x + y of one row of A = [x, y] against a B of ones,
// so the bf16 result is that sum rounded once: the vector rounding of a row-major output
// must give float_to_bf16_rne's bits exactly (ties to even, overflow to infinity, NaN of
// either sign to 0x7FC0).
TEST(Gemm, Bf16OutputRoundsBitForBitLikeTheScalarRounding) {
  const float tie = 1.0f / 256, max_bf16 = nk::bf16_to_float(0x7f7f);
  const std::vector<std::pair<float, float>> sums = {
      {1.0f, tie},                        // tie, even below
      {1.0f + 2 * tie, tie},              // tie, odd below: rounds up
      {1.0f, tie + 1.0f / 4096},          // above the tie
      {-1.0f - 2 * tie, -tie},            // negative tie, odd below
      {max_bf16, std::ldexp(1.0f, 119)},  // tie at the largest finite: overflows to inf
      {INFINITY, 1.0f},
      {-INFINITY, -1.0f},
      {NAN, 1.0f},
      {-NAN, 1.0f},
      {-2.0f, -2 * tie},  // tie at a larger exponent, even below
      {3.0f, -3.0f},
      {0.1f, 0.2f}};
  const int64_t m = static_cast<int64_t>(sums.size()), n = 40, k = 2;
  std::vector<uint16_t> a(m * k), ones(k * n, nk::float_to_bf16_rne(1.0f)), c(m * n);
  std::vector<uint16_t> want(m);
  for (int64_t i = 0; i < m; ++i) {
    a[i * k] = nk::float_to_bf16_rne(sums[i].first);
    a[i * k + 1] = nk::float_to_bf16_rne(sums[i].second);
    want[i] = nk::float_to_bf16_rne(nk::bf16_to_float(a[i * k]) + nk::bf16_to_float(a[i * k + 1]));
  }
  for (nk::IsaLevel level : host_levels()) {
    nk::GemmProblem p;
    p.m = m;
    p.n = n;
    p.k = k;
    p.dtype = nk::GemmDtype::kBFloat16;
    p.a = {a.data(), k, 1, 0};
    p.b = {ones.data(), n, 1, 0};
    p.c = c.data();
    p.c_row_stride = n;
    std::fill(c.begin(), c.end(), uint16_t{0x1234});
    nk::gemm(p, nk::serial_for(), level);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        ASSERT_EQ(c[i * n + j], want[i]) << nk::isa_name(level) << " row " << i << " col " << j;
      }
    }
  }
}

TEST(Gemm, RejectsBadArguments) {
  nk::GemmProblem p;
  p.m = -1;
  EXPECT_THROW(nk::gemm(p, nk::serial_for()), std::invalid_argument);
  p.m = 2;
  p.n = 2;
  p.k = 2;
  EXPECT_THROW(nk::gemm(p, nk::serial_for()), std::invalid_argument);
}

TEST(Gemm, PreferenceFollowsTheHostsBf16Support) {
  using nk::GemmDtype;
  using nk::IsaLevel;
  for (IsaLevel level : host_levels()) {
    EXPECT_TRUE(nk::gemm_preferred(GemmDtype::kFloat32, 4096, 4096, level));
    EXPECT_TRUE(nk::gemm_preferred(GemmDtype::kBFloat16, 8, 4096, level));
    EXPECT_TRUE(nk::gemm_preferred(GemmDtype::kBFloat16, 4096, 8, level));  // W·x: a GEMV
    EXPECT_EQ(nk::gemm_preferred(GemmDtype::kBFloat16, 9, 9, level), level < IsaLevel::kAvx512Bf16);
  }
}
