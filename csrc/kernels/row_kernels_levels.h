// The per-instruction-set instances of row_kernels_impl.h (internal to csrc/kernels).
#pragma once

#include "row_kernels.h"

namespace neuron::kernels {

const RowKernels& row_kernels_baseline();  // the build's baseline (SSE2 on x86-64)
const RowKernels& row_kernels_avx2();      // row_kernels.avx2.cpp
const RowKernels& row_kernels_avx512();    // row_kernels.avx512.cpp

// A per-thread float32 buffer of at least `count` elements (softmax of bfloat16 rows keeps
// exp() unrounded there). Lives in a baseline file: see row_kernels_impl.h.
float* row_scratch(int64_t count);

}  // namespace neuron::kernels
