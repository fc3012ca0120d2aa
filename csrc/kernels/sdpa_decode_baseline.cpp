// The baseline instance: the build's default instructions (4-wide SSE2 on x86-64).
#define SDPA_DECODE_NAMESPACE sdpa_baseline_level
#define SDPA_DECODE_WIDTH 4
#include "sdpa_decode_impl.h"

namespace neuron::kernels::detail {
void sdpa_decode_rows_baseline(const SdpaDecodeProblem& problem, int64_t group, int64_t row_begin,
                               int64_t row_end, float* scratch) {
  SDPA_DECODE_NAMESPACE::rows_entry(problem, group, row_begin, row_end, scratch);
}
}  // namespace neuron::kernels::detail
