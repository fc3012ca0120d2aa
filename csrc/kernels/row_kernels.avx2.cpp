// The AVX2 + FMA instance (8 floats per vector). Reached only when isa_level() >= kAvx2.
#define ROW_KERNELS_NAMESPACE avx2
#define ROW_KERNELS_WIDTH 8
#include "row_kernels_impl.h"

namespace neuron::kernels {
const RowKernels& row_kernels_avx2() { return avx2::kRowKernels; }
}  // namespace neuron::kernels
