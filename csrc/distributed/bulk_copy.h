// Copies of the collectives between user memory and the shared staging buffers.
//
// The staging buffers are read by a core other than the one that wrote them: the lines
// come from that core's cache. glibc's memcpy (rep movsb at these sizes) read such lines at
// 2.1 GB/s when source and destination were not equally aligned on the AMD EPYC host where
// this was measured, 9-12 GB/s when they were; a vector loop prefetching each line
// kPrefetchBytes ahead read them at 10-37 GB/s either way. So reads from staging use that
// loop. (An all_gather whose per-rank bytes are not a multiple of 64, as FSDP's flat
// shards often are, puts every peer's part at such an offset.)
#pragma once

#include <cstddef>

namespace nrt::dist {

// How far ahead of the line being copied a staging line is prefetched: far enough to hide
// a cross-core fetch, near enough to stay in L1 until it is used.
constexpr size_t kPrefetchBytes = 2048;

// Streaming stores (below) bypass the caches where the CPU has them (x86-64): for outputs
// larger than the caches, which the collective will not read again. They leave the staging
// buffers in cache for the peers, and write each output line once instead of first reading
// it into the cache (half the memory traffic of a cached store). Functions that use them
// end with a store fence, so a following release store orders after the written bytes.

// From a staging buffer (any rank's) into user memory: the loop above, with streaming
// stores when `stream` is set, else ordinary ones.
void copy_from_staging(void* dst, const void* src, size_t bytes, bool stream);

// Copies src to `staging` with ordinary stores and to `out` with streaming ones (or memcpy
// when `stream` is false), reading src once: a rank's staging buffer and its own output part.
void copy_twice(void* staging, void* out, const void* src, size_t bytes, bool stream);

}  // namespace nrt::dist
