// The host's compute peak for one core, measured: a loop of independent fused multiply-adds
// (float32) or bf16 dot products (vdpbf16ps where the host has it) with no memory traffic.
// Benchmarks report GEMM throughput as a fraction of this figure, measured in the same run.
#pragma once

#include <cstdint>

#include "cpu_features.h"

namespace neuron::kernels {

// Floating-point operations per CPU-second of the calling thread (a multiply-add counts two),
// for float32 or bf16 inputs at `level` (capped at what the host has), over `iterations`
// rounds of the loop. Without native bf16 dot products, bf16's peak is float32's.
double fma_peak_flops(bool bf16, IsaLevel level, int64_t iterations);

}  // namespace neuron::kernels
