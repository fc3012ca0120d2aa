// The baseline instance: the build's default instructions (4-wide SSE2 on x86-64).
#define ROW_KERNELS_NAMESPACE baseline
#define ROW_KERNELS_WIDTH 4
#include "row_kernels_impl.h"

namespace neuron::kernels {
const RowKernels& row_kernels_baseline() { return baseline::kRowKernels; }
}  // namespace neuron::kernels
