// The commonest reduction of a two-rank collective's large output, a SUM, in one pass:
// both sources are read, added, and the result written with streaming stores (bulk_copy.h
// says why), where the general path combines into an L1 tile or the output with cached
// stores. Through the tile and a streamed copy, one rank's float32 reduce_scatter work took
// 1.3x as long (C++ emulation at 256 MiB); with cached stores each output line is read
// from memory first.
#pragma once

#include <cstddef>
#include <cstdint>

namespace nrt::dist {

// dst[i] = a[i] + b[i] over `count` float32 elements, dst written with streaming stores and
// also to `cached` with ordinary ones when that is set. dst may be a or b. The bits are
// combine()'s, but for which payload survives when both operands are NaN (the first's here;
// in combine()'s vectorised add the compiler picks the order).
void add_streaming(float* dst, const float* a, const float* b, size_t count,
                   float* cached = nullptr);

// The same over bfloat16 bits: each pair widened to float32, added, rounded to nearest even
// (NaN kept quiet): the bits of combine(..., kBFloat16, kSum), NaN + NaN aside as above.
// Vectorised for AVX2 hosts only (widening and rounding make it CPU-bound: a 128-bit loop
// was slower than combine()'s AVX2 blocks); elsewhere element by element.
void add_streaming_bf16(uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t count,
                        uint16_t* cached = nullptr);

// Whether add_streaming_bf16 is vectorised on this host (AVX2, within TORCHNEURON_KERNEL_ISA's
// cap); elsewhere it goes element by element.
bool bf16_sum_vectorised();

}  // namespace nrt::dist
