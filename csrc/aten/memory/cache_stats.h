// What the caching allocator counts, in c10's DeviceStats (torch.neuron.memory_stats() and
// the memory_allocated/memory_reserved family read them), and what it reports to the
// profiler. The DeviceCache that owns the stats holds the lock these helpers need.
#pragma once

#include <c10/core/CachingDeviceAllocator.h>

#include <cstddef>
#include <cstdint>

namespace torchneuron::cache {

using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::StatArray;
using c10::CachingDeviceAllocator::StatType;

constexpr auto kAggregate = static_cast<size_t>(StatType::AGGREGATE);

inline void stat_add(StatArray& stat, bool small, size_t amount) {
  stat[static_cast<size_t>(StatType::AGGREGATE)].increase(amount);
  stat[static_cast<size_t>(small ? StatType::SMALL_POOL : StatType::LARGE_POOL)].increase(amount);
}

inline void stat_sub(StatArray& stat, bool small, size_t amount) {
  stat[static_cast<size_t>(StatType::AGGREGATE)].decrease(amount);
  stat[static_cast<size_t>(small ? StatType::SMALL_POOL : StatType::LARGE_POOL)].decrease(amount);
}

// Memory the allocator does not manage (a shared storage this process mapped) counted as
// one allocation in a segment of its own; `mapped` false uncounts it.
inline void count_external_memory(DeviceStats& stats, size_t nbytes, bool mapped) {
  auto update = mapped ? &stat_add : &stat_sub;
  for (StatArray* count : {&stats.allocation, &stats.segment, &stats.active}) {
    update(*count, /*small=*/false, 1);
  }
  for (StatArray* bytes : {&stats.allocated_bytes, &stats.reserved_bytes, &stats.active_bytes,
                           &stats.requested_bytes}) {
    update(*bytes, /*small=*/false, nbytes);
  }
}

// Calls fn on every Stat of `stats` (to reset peaks or accumulated counts).
template <typename Fn>
void visit_stats(DeviceStats& stats, Fn fn) {
  for (StatArray* array : {&stats.allocation, &stats.segment, &stats.active, &stats.inactive_split,
                           &stats.allocated_bytes, &stats.reserved_bytes, &stats.active_bytes,
                           &stats.inactive_split_bytes, &stats.requested_bytes}) {
    for (auto& stat : *array) fn(stat);
  }
  fn(stats.oversize_allocations);
  fn(stats.oversize_segments);
}

// Zeroes the event counts that are not Stats (retries, OOMs, runtime calls).
inline void reset_counters(DeviceStats& stats) {
  stats.num_alloc_retries = 0;
  stats.num_ooms = 0;
  stats.num_device_alloc = 0;
  stats.num_device_free = 0;
  stats.num_sync_all_streams = 0;
}

// Allocations and frees are reported to the profiler (profile_memory=True) as CUDA's are:
// the block's bytes, positive when handed out and negative when given back, with the
// device's allocated and reserved totals after the change. Reported after the cache's lock
// is released, so the profiler never runs under it.
inline void report_to_profiler(void* ptr, int64_t bytes, size_t allocated, size_t reserved,
                               c10::DeviceIndex device) {
  c10::reportMemoryUsageToProfiler(ptr, bytes, allocated, reserved,
                                   c10::Device(c10::DeviceType::PrivateUse1, device));
}

}  // namespace torchneuron::cache
