#include "fma_peak.h"

#include <time.h>

#include "fma_peak_isa.h"

namespace neuron::kernels {
namespace {

// CPU time of the calling thread: on a shared host, time the thread was not running
// does not count against the measured rate.
double thread_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

double scalar_loop(int64_t iterations) {
  float acc[8] = {};
  for (int64_t i = 0; i < iterations; ++i) {
    for (float& a : acc) a = a * 0.999f + 1e-3f;
  }
  volatile float sink = acc[0] + acc[7];
  (void)sink;
  return 2.0 * 8 * static_cast<double>(iterations);
}

IsaLevel capped(IsaLevel level) {
  const CpuFeatures& f = cpu_features();
  const IsaLevel best = f.avx512_bf16 ? IsaLevel::kAvx512Bf16
                        : f.avx512    ? IsaLevel::kAvx512
                        : f.avx2      ? IsaLevel::kAvx2
                                      : IsaLevel::kScalar;
  return level > best ? best : level;
}

}  // namespace

double fma_peak_flops(bool bf16, IsaLevel level, int64_t iterations) {
  level = capped(level);
  const double start = thread_seconds();
  double flops = 0;
  switch (level) {
#if defined(__x86_64__) || defined(_M_X64)
    case IsaLevel::kAmxBf16:
    case IsaLevel::kAvx512Bf16:
      flops = bf16 ? detail::dpbf16_loop_avx512(iterations) : detail::fma_loop_avx512(iterations);
      break;
    case IsaLevel::kAvx512:
      flops = detail::fma_loop_avx512(iterations);
      break;
    case IsaLevel::kAvx2:
      flops = detail::fma_loop_avx2(iterations);
      break;
#endif
    default:
      flops = scalar_loop(iterations);
  }
  return flops / (thread_seconds() - start);
}

}  // namespace neuron::kernels
