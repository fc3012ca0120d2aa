// The measured choice between the native GEMM and PyTorch's CPU library (gemm_route.h).
#include "native/gemm_route.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

namespace torchneuron {
namespace {

enum class RouteMode { kMeasure, kNative, kLibrary };

RouteMode route_mode() {
  static const RouteMode mode = [] {
    const char* value = std::getenv("TORCHNEURON_GEMM_ROUTE");
    if (value == nullptr || *value == '\0' || std::strcmp(value, "measure") == 0) {
      return RouteMode::kMeasure;
    }
    if (std::strcmp(value, "native") == 0) return RouteMode::kNative;
    if (std::strcmp(value, "library") == 0) return RouteMode::kLibrary;
    TORCH_CHECK(false, "TORCHNEURON_GEMM_ROUTE='", value,
                "' is not valid: use measure (time both kernels once per shape class, the "
                "default), native (the native GEMM) or library (PyTorch's CPU kernel)");
  }();
  return mode;
}

struct Decision {
  GemmRoute route = GemmRoute::kNative;
  double native_s = 0;
  double library_s = 0;
};

struct Decisions {
  std::mutex mutex;
  std::map<ProductClass, Decision> by_class;
};

Decisions& decisions() {
  static Decisions* instance = new Decisions();  // never destroyed: products may run at exit
  return *instance;
}

int floor_log2(int64_t v) {
  int bits = 0;
  while (v > 1) {
    v >>= 1;
    ++bits;
  }
  return bits;
}

double seconds_of(const std::function<void()>& run) {
  const auto start = std::chrono::steady_clock::now();
  run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// One untimed run each (page faults, packing buffers), then three timed rounds in
// alternating order; the best of each side, so a round another process interrupted does not
// decide.
constexpr int kTimedRounds = 3;

Decision measure(const std::function<void()>& run_native,
                 const std::function<void()>& run_library) {
  run_native();
  run_library();
  Decision d;
  d.native_s = d.library_s = 1e30;
  for (int round = 0; round < kTimedRounds; ++round) {
    if (round % 2 == 0) {
      d.native_s = std::min(d.native_s, seconds_of(run_native));
      d.library_s = std::min(d.library_s, seconds_of(run_library));
    } else {
      d.library_s = std::min(d.library_s, seconds_of(run_library));
      d.native_s = std::min(d.native_s, seconds_of(run_native));
    }
  }
  d.route = d.library_s < d.native_s ? GemmRoute::kLibrary : GemmRoute::kNative;
  return d;
}

}  // namespace

bool ProductClass::operator<(const ProductClass& other) const {
  return std::tie(m_log2, n_log2, k_log2, a_transposed, b_transposed) <
         std::tie(other.m_log2, other.n_log2, other.k_log2, other.a_transposed, other.b_transposed);
}

ProductClass product_class(int64_t m, int64_t n, int64_t k, bool a_transposed, bool b_transposed) {
  return {floor_log2(m), floor_log2(n), floor_log2(k), a_transposed, b_transposed};
}

GemmRoute gemm_route(const ProductClass& cls, const std::function<void()>& run_native,
                     const std::function<void()>& run_library) {
  switch (route_mode()) {
    case RouteMode::kNative:
      return GemmRoute::kNative;
    case RouteMode::kLibrary:
      return GemmRoute::kLibrary;
    case RouteMode::kMeasure:
      break;
  }
  Decisions& all = decisions();
  // Held while measuring: two threads meeting a new class at once would time each other.
  std::lock_guard<std::mutex> lock(all.mutex);
  const auto found = all.by_class.find(cls);
  if (found != all.by_class.end()) return found->second.route;
  const Decision d = measure(run_native, run_library);
  all.by_class.emplace(cls, d);
  return d.route;
}

std::vector<std::string> decided_gemm_routes() {
  Decisions& all = decisions();
  std::lock_guard<std::mutex> lock(all.mutex);
  std::vector<std::string> lines;
  for (const auto& [cls, d] : all.by_class) {
    lines.push_back(std::to_string(int64_t{1} << cls.m_log2) + "," +
                    std::to_string(int64_t{1} << cls.n_log2) + "," +
                    std::to_string(int64_t{1} << cls.k_log2) + "," +
                    (cls.a_transposed ? "t" : "n") + "," + (cls.b_transposed ? "t" : "n") + ":" +
                    (d.route == GemmRoute::kLibrary ? "library" : "native") + ":" +
                    std::to_string(d.native_s) + "," + std::to_string(d.library_s));
  }
  return lines;
}

}  // namespace torchneuron
