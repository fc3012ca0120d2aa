// The AVX512-BF16 instance: as AVX-512, with bf16 q·k on vdpbf16ps (head_dim a multiple of 32).
// Reached only when isa_level() >= kAvx512Bf16.
#define SDPA_DECODE_NAMESPACE sdpa_avx512_bf16_level
#define SDPA_DECODE_WIDTH 16
#include "sdpa_decode_impl.h"

namespace neuron::kernels::detail {
void sdpa_decode_rows_avx512_bf16(const SdpaDecodeProblem& problem, int64_t group,
                                  int64_t row_begin, int64_t row_end, float* scratch) {
  SDPA_DECODE_NAMESPACE::rows_entry(problem, group, row_begin, row_end, scratch);
}
}  // namespace neuron::kernels::detail
