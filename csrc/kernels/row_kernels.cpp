// The row kernels' table for an instruction-set level (row_kernels.h), and the per-thread
// scratch rows they share.
#include "row_kernels.h"

#include <vector>

#include "row_kernels_levels.h"

namespace neuron::kernels {

float* row_scratch(int64_t count) {
  thread_local std::vector<float> scratch;
  if (static_cast<int64_t>(scratch.size()) < count) scratch.resize(static_cast<size_t>(count));
  return scratch.data();
}

const RowKernels& row_kernels_for(IsaLevel level) {
#if defined(__x86_64__) || defined(_M_X64)
  if (level >= IsaLevel::kAvx512) return row_kernels_avx512();
  if (level >= IsaLevel::kAvx2) return row_kernels_avx2();
#else
  (void)level;
#endif
  return row_kernels_baseline();
}

const RowKernels& row_kernels() {
  static const RowKernels& chosen = row_kernels_for(isa_level());
  return chosen;
}

}  // namespace neuron::kernels
