// The caching allocator's cache of one device: allocation and free under the device's lock,
// the per-size stash of small freed blocks, blocks waiting for other streams (recordStream),
// new segments (with a retry after releasing cached memory) and the out-of-memory error.
#include "memory/device_cache.h"

#include <c10/util/Exception.h>

#include "device/runtime_status.h"
#include "launch/async_launch.h"
#include "memory/caching_allocator.h"

namespace torchneuron::cache {

Block* DeviceCache::allocate(size_t nbytes, c10::StreamId stream) {
  Block* block = nullptr;
  size_t allocated = 0;
  size_t reserved = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    block = allocate_locked(nbytes, stream);
    allocated = stats_.allocated_bytes[kAggregate].current;
    reserved = stats_.reserved_bytes[kAggregate].current;
  }
  if (C10_UNLIKELY(c10::memoryProfilingEnabled())) {
    report_to_profiler(block->ptr, static_cast<int64_t>(block->size), allocated, reserved, device_);
  }
  return block;
}

// Returns false if ptr is not one of this device's live blocks.
bool DeviceCache::free(void* ptr) {
  size_t bytes = 0;
  size_t allocated = 0;
  size_t reserved = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_locked(ptr, &bytes)) return false;
    allocated = stats_.allocated_bytes[kAggregate].current;
    reserved = stats_.reserved_bytes[kAggregate].current;
  }
  if (C10_UNLIKELY(c10::memoryProfilingEnabled())) {
    report_to_profiler(ptr, -static_cast<int64_t>(bytes), allocated, reserved, device_);
  }
  return true;
}

void DeviceCache::count_external(size_t nbytes, bool mapped) {
  std::lock_guard<std::mutex> lock(mutex_);
  count_external_memory(stats_, nbytes, mapped);
}

bool DeviceCache::record_stream(void* ptr, c10::StreamId stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocated_.find(ptr);
  if (it == allocated_.end()) return false;
  if (stream != it->second->stream) it->second->stream_uses.insert(stream);
  return true;
}

// Returns blocks whose other-stream uses (record_stream) have completed to the pool.
void DeviceCache::process_pending_events() {
  std::lock_guard<std::mutex> lock(mutex_);
  process_pending(/*wait=*/false);
}

void DeviceCache::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  process_pending(/*wait=*/true);
  flush_stash();
  segments_.release_whole_segments();
}

// Like empty_cache, but gives up if the device is busy (no lock-order deadlock when two
// devices run out of memory at once).
void DeviceCache::try_empty_cache() {
  if (launched_work_pending()) return;  // its free blocks may still be read
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  process_pending(/*wait=*/false);
  flush_stash();
  segments_.release_whole_segments();
}

DeviceStats DeviceCache::stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  flush_stash();
  return stats_;
}

void DeviceCache::reset_accumulated() {
  for_each_stat([](c10::CachingAllocator::Stat& s) { s.reset_accumulated(); });
  std::lock_guard<std::mutex> lock(mutex_);
  reset_counters(stats_);
}

Block* DeviceCache::allocate_locked(size_t nbytes, c10::StreamId stream) {
  const size_t size = round_size(nbytes);
  process_pending(/*wait=*/false);
  const bool small = size <= kSmallSize;
  BlockPool& pool = segments_.pool_for(small);
  Block* block = take_stashed(size, stream);
  if (block == nullptr) {
    block = segments_.take_free(pool, stream, size);
    if (block == nullptr && stashed_ > 0) {
      // Stashed blocks may merge into one that fits: no new segment before trying.
      flush_stash();
      block = segments_.take_free(pool, stream, size);
    }
    if (block == nullptr) block = new_segment(size, stream, small, nbytes);
    block = segments_.split(block, size, pool);
  }
  block->allocated = true;
  block->requested = nbytes;
  allocated_.emplace(block->ptr, block);
  stat_add(stats_.allocation, small, 1);
  stat_add(stats_.active, small, 1);
  stat_add(stats_.allocated_bytes, small, block->size);
  stat_add(stats_.active_bytes, small, block->size);
  stat_add(stats_.requested_bytes, small, nbytes);
  return block;
}

// Marks ptr's block free; false if ptr is not one of this device's live blocks.
bool DeviceCache::free_locked(void* ptr, size_t* bytes) {
  auto it = allocated_.find(ptr);
  if (it == allocated_.end()) return false;
  Block* block = it->second;
  *bytes = block->size;
  allocated_.erase(it);
  block->allocated = false;
  stat_sub(stats_.allocation, block->small, 1);
  stat_sub(stats_.allocated_bytes, block->small, block->size);
  stat_sub(stats_.requested_bytes, block->small, block->requested);
  if (!block->stream_uses.empty()) {
    defer_until_streams_reach(block);
  } else if (!stash(block)) {
    release_to_pool(block);
  }
  return true;
}

bool DeviceCache::stash(Block* block) {
  if (!block->small || block->size > kQuickClasses * kMinBlockSize) return false;
  auto& stash = stash_[stash_class(block->size)];
  if (stash.size() >= kQuickDepth) return false;
  stat_sub(stats_.active, block->small, 1);
  stat_sub(stats_.active_bytes, block->small, block->size);
  stash.push_back(block);
  ++stashed_;
  return true;
}

Block* DeviceCache::take_stashed(size_t size, c10::StreamId stream) {
  if (stashed_ == 0 || size > kQuickClasses * kMinBlockSize) return nullptr;
  auto& stash = stash_[stash_class(size)];
  for (size_t i = stash.size(); i-- > 0;) {
    Block* block = stash[i];
    if (block->stream != stream) continue;
    stash.erase(stash.begin() + static_cast<std::ptrdiff_t>(i));
    --stashed_;
    return block;
  }
  return nullptr;
}

void DeviceCache::flush_stash() {
  if (stashed_ == 0) return;
  for (auto& stash : stash_) {
    for (Block* block : stash) segments_.return_to_pool(block);
    stash.clear();
  }
  stashed_ = 0;
}

Block* DeviceCache::new_segment(size_t size, c10::StreamId stream, bool small, size_t requested) {
  const size_t bytes = segment_size(size);
  void* ptr = nullptr;
  nrt_status status = nrt_mem_alloc(device_, bytes, &ptr);
  if (status == NRT_OUT_OF_MEMORY) {
    // Give cached, unused segments back and try once more before reporting.
    stats_.num_alloc_retries += 1;
    // Free blocks may still be read by launched work (a free is stream-ordered): their
    // memory stays mapped until it completes. allocate_on then waits, unlocked, and retries.
    if (!launched_work_pending()) {
      process_pending(/*wait=*/true);
      segments_.release_whole_segments();
      release_cached_on_other_devices(device_);
      status = nrt_mem_alloc(device_, bytes, &ptr);
    }
  }
  if (status == NRT_OUT_OF_MEMORY) {
    stats_.num_ooms += 1;
    throw_out_of_memory(requested, bytes);
  }
  NEURON_CHECK(status);
  return segments_.add_segment(ptr, bytes, stream, small);
}

void DeviceCache::throw_out_of_memory(size_t requested, size_t segment) {
  uint64_t used = 0, capacity = 0;
  nrt_mem_get_info(device_, &used, &capacity);
  uint64_t budget_used = 0, budget = 0;
  nrt_host_budget(&budget_used, &budget);
  const auto agg = static_cast<size_t>(StatType::AGGREGATE);
  const uint64_t allocated = stats_.allocated_bytes[agg].current;
  const uint64_t reserved = stats_.reserved_bytes[agg].current;
  const std::string runtime_message = nrt_last_error();
  // An OOM row in profile_memory traces (the profiler only queues it: safe under our lock).
  c10::reportOutOfMemoryToProfiler(static_cast<int64_t>(requested), allocated, reserved,
                                   c10::Device(c10::DeviceType::PrivateUse1, device_));
  TORCH_CHECK_WITH(OutOfMemoryError, false, "neuron:", static_cast<int>(device_),
                   " is out of memory: tried to allocate ", format_bytes(requested),
                   " (a segment of ", format_bytes(segment), "). The device has ",
                   format_bytes(capacity), " of capacity, of which ", format_bytes(used),
                   " is in use; PyTorch has ", format_bytes(allocated),
                   " allocated in tensors and ", format_bytes(reserved - allocated),
                   " cached but unused by the caching allocator. The process-wide host "
                   "budget is ",
                   format_bytes(budget), " (", format_bytes(budget_used),
                   " used; set TORCHNEURON_HOST_MEMORY_BUDGET to change it). Free tensors, "
                   "call torch.neuron.empty_cache(), or reduce the batch size or sequence "
                   "length. Runtime: ",
                   runtime_message);
}

void DeviceCache::defer_until_streams_reach(Block* block) {
  for (c10::StreamId stream : block->stream_uses) {
    nrt_event_t event = nullptr;
    NEURON_CHECK(nrt_event_create(NRT_EVENT_DEFAULT, &event));
    NEURON_CHECK(nrt_event_record(event, device_, static_cast<int>(stream)));
    pending_.emplace_back(event, block);
    block->pending_events += 1;
  }
  block->stream_uses.clear();
}

void DeviceCache::process_pending(bool wait) {
  while (!pending_.empty()) {
    auto [event, block] = pending_.front();
    if (wait) {
      NEURON_CHECK(nrt_event_synchronize(event));
    } else if (nrt_event_query(event) == NRT_NOT_READY) {
      break;
    }
    nrt_event_destroy(event);
    pending_.pop_front();
    if (--block->pending_events == 0) release_to_pool(block);
  }
}

void DeviceCache::release_to_pool(Block* block) {
  stat_sub(stats_.active, block->small, 1);
  stat_sub(stats_.active_bytes, block->small, block->size);
  segments_.return_to_pool(block);
}

}  // namespace torchneuron::cache
