// gemm(): argument checks, the run-time choice of instruction set, and the portable
// (scalar) build of the algorithm in gemm_tiles.h.
#include "gemm.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "gemm_isa.h"
#include "gemm_tiles.h"

namespace neuron::kernels {
namespace detail {
namespace {

struct ScalarVec {
  using Reg = float;
  static constexpr int kWidth = 1;
  static constexpr int kRegisters = 16;
  static Reg zero() { return 0.0f; }
  static Reg load(const float* p) { return *p; }
  static Reg load(const uint16_t* p) { return bf16_to_float(*p); }
  static void load_pairs(const uint16_t* p, Reg* even, Reg* odd) {
    *even = bf16_to_float(p[0]);
    *odd = bf16_to_float(p[1]);
  }
  static void store(float* p, Reg v) { *p = v; }
  static void store(uint16_t* p, Reg v) { *p = float_to_bf16_rne(v); }
  static Reg set1(float v) { return v; }
  static Reg fma(Reg a, Reg b, Reg c) { return a * b + c; }
  static Reg add(Reg a, Reg b) { return a + b; }
  static float sum(Reg v) { return v; }
};

}  // namespace

void gemm_scalar(const GemmProblem& problem, const ParallelFor& parallel) {
  GemmTiles<ScalarVec, 4>::run(problem, parallel);
}

}  // namespace detail

namespace {

void check(const GemmProblem& p) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("gemm: " + what); };
  if (p.batch < 0 || p.m < 0 || p.n < 0 || p.k < 0) fail("negative size");
  if (p.batch == 0 || p.m == 0 || p.n == 0) return;
  if (p.c == nullptr) fail("no output");
  if (p.k > 0 && (p.a.data == nullptr || p.b.data == nullptr)) fail("no input");
}

}  // namespace

ParallelFor serial_for() {
  ParallelFor serial;
  serial.threads = 1;
  serial.run = [](int64_t tasks, const std::function<void(int64_t, int64_t)>& body) {
    if (tasks > 0) body(0, tasks);
  };
  return serial;
}

void gemm(const GemmProblem& problem, const ParallelFor& parallel, IsaLevel level) {
  check(problem);
  if (problem.batch == 0 || problem.m == 0 || problem.n == 0) return;
  const IsaLevel best = host_isa_level();
  if (level > best) level = best;
  switch (level) {
#if defined(__x86_64__) || defined(_M_X64)
    case IsaLevel::kAmxBf16:
    case IsaLevel::kAvx512Bf16:
      detail::gemm_avx512_bf16(problem, parallel);
      return;
    case IsaLevel::kAvx512:
      detail::gemm_avx512(problem, parallel);
      return;
    case IsaLevel::kAvx2:
      detail::gemm_avx2(problem, parallel);
      return;
#endif
    default:
      detail::gemm_scalar(problem, parallel);
  }
}

bool gemm_preferred(GemmDtype dtype, int64_t m, int64_t n, IsaLevel level) {
  if (dtype != GemmDtype::kBFloat16 || m <= 8 || n <= 8) return true;
  return std::min(level, host_isa_level()) < IsaLevel::kAvx512Bf16;
}

void gemm(const GemmProblem& problem, const ParallelFor& parallel) {
  gemm(problem, parallel, isa_level());
}

}  // namespace neuron::kernels
