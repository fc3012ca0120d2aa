// The segments of the caching allocator (caching_allocator.h): device memory is reserved
// from the runtime in segments, carved into blocks, and free blocks wait in two pools (small
// and large requests), ordered by stream and size. A freed block merges with the free
// neighbours of its segment; a segment that is free as a whole can go back to the runtime.
#pragma once

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/util/flat_hash_map.h>

#include <cstddef>
#include <set>
#include <tuple>

namespace torchneuron::cache {

constexpr size_t kMinBlockSize = 512;        // every size is rounded up to this
constexpr size_t kSmallSize = 1 << 20;       // requests up to 1 MiB use the small pool
constexpr size_t kSmallSegment = 2 << 20;    // small-pool segments are 2 MiB
constexpr size_t kMediumSegment = 20 << 20;  // requests below 10 MiB share 20 MiB segments
constexpr size_t kMinLargeAlloc = 10 << 20;  // larger requests get their own segment
constexpr size_t kLargeRounding = 2 << 20;   // ... rounded up to 2 MiB

struct Block {
  c10::DeviceIndex device;
  c10::StreamId stream;
  size_t size;
  void* ptr;
  bool small;
  bool allocated = false;
  size_t requested = 0;
  Block* prev = nullptr;  // neighbours inside the same segment
  Block* next = nullptr;
  ska::flat_hash_set<c10::StreamId> stream_uses;
  int pending_events = 0;
};

struct BlockOrder {
  bool operator()(const Block* a, const Block* b) const {
    return std::tie(a->stream, a->size, a->ptr) < std::tie(b->stream, b->size, b->ptr);
  }
};

using BlockPool = std::set<Block*, BlockOrder>;

inline size_t round_size(size_t nbytes) {
  return nbytes < kMinBlockSize ? kMinBlockSize
                                : kMinBlockSize * ((nbytes + kMinBlockSize - 1) / kMinBlockSize);
}

inline size_t segment_size(size_t size) {
  if (size <= kSmallSize) return kSmallSegment;
  if (size < kMinLargeAlloc) return kMediumSegment;
  return kLargeRounding * ((size + kLargeRounding - 1) / kLargeRounding);
}

// One device's free blocks. Not locked: its DeviceCache holds the device's lock.
class SegmentPools {
 public:
  // Segments, reserved bytes and inactive splits are counted in `stats` (the cache's).
  SegmentPools(c10::DeviceIndex device, c10::CachingDeviceAllocator::DeviceStats& stats)
      : device_(device), stats_(stats) {}

  BlockPool& pool_for(bool small) { return small ? small_free_ : large_free_; }
  // A free block of `stream` of at least `size` bytes, taken out of `pool`; null if none
  // suits.
  Block* take_free(BlockPool& pool, c10::StreamId stream, size_t size);
  // Keeps the first `size` bytes of `block`; the rest, if worth keeping apart, goes to `pool`.
  Block* split(Block* block, size_t size, BlockPool& pool);
  // Merges an inactive block with free neighbours into its pool.
  void return_to_pool(Block* block);
  // A segment of `bytes` at `ptr`, just reserved from the runtime, as one block of `stream`.
  Block* add_segment(void* ptr, size_t bytes, c10::StreamId stream, bool small);
  // Gives every segment that is free as a whole back to the runtime (small pool first).
  void release_whole_segments();

 private:
  void merge_with(Block* block, Block* neighbour, BlockPool& pool);
  void release_whole_segments(BlockPool& pool);

  c10::DeviceIndex device_;
  c10::CachingDeviceAllocator::DeviceStats& stats_;
  BlockPool small_free_;
  BlockPool large_free_;
};

}  // namespace torchneuron::cache
