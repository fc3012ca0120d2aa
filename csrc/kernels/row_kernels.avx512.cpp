// The AVX-512 instance (16 floats per vector). Reached only when isa_level() >= kAvx512.
#define ROW_KERNELS_NAMESPACE avx512
#define ROW_KERNELS_WIDTH 16
#include "row_kernels_impl.h"

namespace neuron::kernels {
const RowKernels& row_kernels_avx512() { return avx512::kRowKernels; }
}  // namespace neuron::kernels
