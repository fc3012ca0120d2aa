// One device's cache of the caching allocator (caching_allocator.h): blocks carved from
// runtime segments (cache_segments.h), reused per stream, and counted in c10's DeviceStats
// (cache_stats.h). Thread-safe: every call takes the device's lock.
#pragma once

#include <c10/util/SmallVector.h>
#include <c10/util/flat_hash_map.h>

#include <array>
#include <deque>
#include <mutex>
#include <utility>

#include "memory/cache_segments.h"
#include "memory/cache_stats.h"
#include "neuron_runtime.h"

namespace torchneuron::cache {

constexpr size_t kQuickClasses = 8;  // stashed sizes: 512 B, 1 KiB, ... 4 KiB
constexpr size_t kQuickDepth = 8;    // blocks stashed per size

// Devices share the process's host budget, so memory cached on one can starve another
// (caching_allocator.cpp).
void release_cached_on_other_devices(c10::DeviceIndex except);

class DeviceCache {
 public:
  explicit DeviceCache(c10::DeviceIndex device) : device_(device), segments_(device, stats_) {}

  Block* allocate(size_t nbytes, c10::StreamId stream);
  // Returns false if ptr is not one of this device's live blocks.
  bool free(void* ptr);
  void count_external(size_t nbytes, bool mapped);
  bool record_stream(void* ptr, c10::StreamId stream);
  // Returns blocks whose other-stream uses (record_stream) have completed to the pool.
  void process_pending_events();
  void empty_cache();
  // Like empty_cache, but gives up if the device is busy (no lock-order deadlock when two
  // devices run out of memory at once).
  void try_empty_cache();
  DeviceStats stats();

  // Calls fn on every Stat, with the stash merged first (as every read of the stats).
  template <typename Fn>
  void for_each_stat(Fn fn) {
    std::lock_guard<std::mutex> lock(mutex_);
    flush_stash();
    visit_stats(stats_, fn);
  }

  void reset_accumulated();

 private:
  Block* allocate_locked(size_t nbytes, c10::StreamId stream);
  // Marks ptr's block free; false if ptr is not one of this device's live blocks.
  bool free_locked(void* ptr, size_t* bytes);

  // Small-tensor workloads free and allocate blocks of a few sizes on every op. Returning
  // such a block to the pool merges it with its neighbour, and the next request splits it
  // off again (a set erase and insert, a Block new and delete each time). Instead, a freed
  // small block waits unmerged in a short per-size stash and serves the next request of its
  // size and stream as is. The stash is merged into the pool (flush_stash) before stats are
  // read, before a new segment is reserved and when the cache is emptied, so what is
  // observable (stats, reserved memory) is as if every block had gone back to the pool.
  static size_t stash_class(size_t size) { return size / kMinBlockSize - 1; }
  bool stash(Block* block);
  Block* take_stashed(size_t size, c10::StreamId stream);
  void flush_stash();
  Block* new_segment(size_t size, c10::StreamId stream, bool small, size_t requested);
  [[noreturn]] void throw_out_of_memory(size_t requested, size_t segment);
  void defer_until_streams_reach(Block* block);
  void process_pending(bool wait);
  void release_to_pool(Block* block);

  c10::DeviceIndex device_;
  std::mutex mutex_;
  DeviceStats stats_;  // before segments_, which counts into it
  SegmentPools segments_;
  ska::flat_hash_map<void*, Block*> allocated_;
  std::deque<std::pair<nrt_event_t, Block*>> pending_;
  std::array<c10::SmallVector<Block*, kQuickDepth>, kQuickClasses> stash_;
  size_t stashed_ = 0;
};

}  // namespace torchneuron::cache
