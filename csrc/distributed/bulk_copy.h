// Copies of the collectives between user memory and the shared staging buffers.
#pragma once

#include <cstddef>

namespace nrt::dist {

// memcpy, but with stores that bypass the caches where the CPU has them (x86-64): for
// outputs larger than the caches, which the collective will not read again. It leaves
// the staging buffers in cache for the peers, and it writes each output line once instead
// of first reading it into the cache (half the memory traffic of a cached store).
// Ends with a store fence, so a following release store orders after the copied bytes.
void copy_streaming(void* dst, const void* src, size_t bytes);

// Copies src to `cached` with ordinary stores and to `out` as copy_streaming (or memcpy when
// `stream` is false), reading src once: a rank's staging buffer and its own output part.
void copy_twice(void* cached, void* out, const void* src, size_t bytes, bool stream);

}  // namespace nrt::dist
