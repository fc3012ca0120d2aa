// fma_peak_flops() (fma_peak.h): times the loop of the chosen instruction set on the calling
// thread's CPU time.
#include "fma_peak.h"

#include <time.h>

#include <algorithm>

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

}  // namespace

double fma_peak_flops(bool bf16, IsaLevel level, int64_t iterations) {
  // AMX hosts run the AVX512-BF16 loops (the switch below treats the two levels alike).
  level = std::min(level, host_isa_level());
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
