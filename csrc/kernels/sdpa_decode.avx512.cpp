// The AVX-512 instance (16 floats per vector). Reached only when isa_level() >= kAvx512.
#define SDPA_DECODE_NAMESPACE sdpa_avx512_level
#define SDPA_DECODE_WIDTH 16
#include "sdpa_decode_impl.h"

namespace neuron::kernels::detail {
void sdpa_decode_rows_avx512(const SdpaDecodeProblem& problem, int64_t group, int64_t row_begin,
                             int64_t row_end, float* scratch) {
  SDPA_DECODE_NAMESPACE::rows_entry(problem, group, row_begin, row_end, scratch);
}
}  // namespace neuron::kernels::detail
