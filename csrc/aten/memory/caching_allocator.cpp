#include "memory/caching_allocator.h"

#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>
#include <c10/util/flat_hash_map.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>
#include <vector>

#include "device/device_state.h"
#include "device/runtime_status.h"
#include "device/stream_state.h"
#include "launch/async_launch.h"

namespace torchneuron {
namespace {

using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingDeviceAllocator::StatArray;
using c10::CachingDeviceAllocator::StatType;

constexpr size_t kMinBlockSize = 512;        // every size is rounded up to this
constexpr size_t kSmallSize = 1 << 20;       // requests up to 1 MiB use the small pool
constexpr size_t kSmallSegment = 2 << 20;    // small-pool segments are 2 MiB
constexpr size_t kMediumSegment = 20 << 20;  // requests below 10 MiB share 20 MiB segments
constexpr size_t kMinLargeAlloc = 10 << 20;  // larger requests get their own segment
constexpr size_t kLargeRounding = 2 << 20;   // ... rounded up to 2 MiB
constexpr size_t kQuickClasses = 8;          // stashed sizes: 512 B, 1 KiB, ... 4 KiB
constexpr size_t kQuickDepth = 8;            // blocks stashed per size

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

void stat_add(StatArray& stat, bool small, size_t amount) {
  stat[static_cast<size_t>(StatType::AGGREGATE)].increase(amount);
  stat[static_cast<size_t>(small ? StatType::SMALL_POOL : StatType::LARGE_POOL)].increase(amount);
}

void stat_sub(StatArray& stat, bool small, size_t amount) {
  stat[static_cast<size_t>(StatType::AGGREGATE)].decrease(amount);
  stat[static_cast<size_t>(small ? StatType::SMALL_POOL : StatType::LARGE_POOL)].decrease(amount);
}

size_t round_size(size_t nbytes) {
  return nbytes < kMinBlockSize ? kMinBlockSize
                                : kMinBlockSize * ((nbytes + kMinBlockSize - 1) / kMinBlockSize);
}

size_t segment_size(size_t size) {
  if (size <= kSmallSize) return kSmallSegment;
  if (size < kMinLargeAlloc) return kMediumSegment;
  return kLargeRounding * ((size + kLargeRounding - 1) / kLargeRounding);
}

// Devices share the process's host budget, so memory cached on one can starve another.
void release_cached_on_other_devices(c10::DeviceIndex except);

// Allocations and frees are reported to the profiler (profile_memory=True) as CUDA's are:
// the block's bytes, positive when handed out and negative when given back, with the
// device's allocated and reserved totals after the change. Reported after the cache's lock
// is released, so the profiler never runs under it.
void report_to_profiler(void* ptr, int64_t bytes, size_t allocated, size_t reserved,
                        c10::DeviceIndex device) {
  c10::reportMemoryUsageToProfiler(ptr, bytes, allocated, reserved,
                                   c10::Device(c10::DeviceType::PrivateUse1, device));
}

constexpr auto kAggregate = static_cast<size_t>(StatType::AGGREGATE);

class DeviceCache {
 public:
  explicit DeviceCache(c10::DeviceIndex device) : device_(device) {}

  Block* allocate(size_t nbytes, c10::StreamId stream) {
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
      report_to_profiler(block->ptr, static_cast<int64_t>(block->size), allocated, reserved,
                         device_);
    }
    return block;
  }

  // Returns false if ptr is not one of this device's live blocks.
  bool free(void* ptr) {
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

  void count_external(size_t nbytes, bool mapped) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto update = mapped ? &stat_add : &stat_sub;
    for (StatArray* count : {&stats_.allocation, &stats_.segment, &stats_.active}) {
      update(*count, /*small=*/false, 1);
    }
    for (StatArray* bytes : {&stats_.allocated_bytes, &stats_.reserved_bytes, &stats_.active_bytes,
                             &stats_.requested_bytes}) {
      update(*bytes, /*small=*/false, nbytes);
    }
  }

  bool record_stream(void* ptr, c10::StreamId stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = allocated_.find(ptr);
    if (it == allocated_.end()) return false;
    if (stream != it->second->stream) it->second->stream_uses.insert(stream);
    return true;
  }

  // Returns blocks whose other-stream uses (record_stream) have completed to the pool.
  void process_pending_events() {
    std::lock_guard<std::mutex> lock(mutex_);
    process_pending(/*wait=*/false);
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mutex_);
    process_pending(/*wait=*/true);
    flush_stash();
    release_whole_segments(small_free_);
    release_whole_segments(large_free_);
  }

  // Like empty_cache, but gives up if the device is busy (no lock-order deadlock when two
  // devices run out of memory at once).
  void try_empty_cache() {
    if (launched_work_pending()) return;  // its free blocks may still be read
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock()) return;
    process_pending(/*wait=*/false);
    flush_stash();
    release_whole_segments(small_free_);
    release_whole_segments(large_free_);
  }

  DeviceStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    flush_stash();
    return stats_;
  }

  template <typename Fn>
  void for_each_stat(Fn fn) {
    std::lock_guard<std::mutex> lock(mutex_);
    flush_stash();
    for (StatArray* array :
         {&stats_.allocation, &stats_.segment, &stats_.active, &stats_.inactive_split,
          &stats_.allocated_bytes, &stats_.reserved_bytes, &stats_.active_bytes,
          &stats_.inactive_split_bytes, &stats_.requested_bytes}) {
      for (auto& stat : *array) fn(stat);
    }
    fn(stats_.oversize_allocations);
    fn(stats_.oversize_segments);
  }

  void reset_accumulated() {
    for_each_stat([](c10::CachingAllocator::Stat& s) { s.reset_accumulated(); });
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.num_alloc_retries = 0;
    stats_.num_ooms = 0;
    stats_.num_device_alloc = 0;
    stats_.num_device_free = 0;
    stats_.num_sync_all_streams = 0;
  }

 private:
  Block* allocate_locked(size_t nbytes, c10::StreamId stream) {
    const size_t size = round_size(nbytes);
    process_pending(/*wait=*/false);
    const bool small = size <= kSmallSize;
    BlockPool& pool = small ? small_free_ : large_free_;
    Block* block = take_stashed(size, stream);
    if (block == nullptr) {
      block = take_free(pool, stream, size);
      if (block == nullptr && stashed_ > 0) {
        // Stashed blocks may merge into one that fits: no new segment before trying.
        flush_stash();
        block = take_free(pool, stream, size);
      }
      if (block == nullptr) block = new_segment(size, stream, small, nbytes);
      block = split(block, size, pool);
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
  bool free_locked(void* ptr, size_t* bytes) {
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

  // Small-tensor workloads free and allocate blocks of a few sizes on every op. Returning
  // such a block to the pool merges it with its neighbour, and the next request splits it
  // off again (a set erase and insert, a Block new and delete each time). Instead, a freed
  // small block waits unmerged in a short per-size stash and serves the next request of its
  // size and stream as is. The stash is merged into the pool (flush_stash) before stats are
  // read, before a new segment is reserved and when the cache is emptied, so what is
  // observable (stats, reserved memory) is as if every block had gone back to the pool.
  static size_t stash_class(size_t size) { return size / kMinBlockSize - 1; }

  bool stash(Block* block) {
    if (!block->small || block->size > kQuickClasses * kMinBlockSize) return false;
    auto& stash = stash_[stash_class(block->size)];
    if (stash.size() >= kQuickDepth) return false;
    stat_sub(stats_.active, block->small, 1);
    stat_sub(stats_.active_bytes, block->small, block->size);
    stash.push_back(block);
    ++stashed_;
    return true;
  }

  Block* take_stashed(size_t size, c10::StreamId stream) {
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

  void flush_stash() {
    if (stashed_ == 0) return;
    for (auto& stash : stash_) {
      for (Block* block : stash) return_to_pool(block);
      stash.clear();
    }
    stashed_ = 0;
  }

  Block* take_free(BlockPool& pool, c10::StreamId stream, size_t size) {
    Block key{device_, stream, size, nullptr, false};
    auto it = pool.lower_bound(&key);
    if (it == pool.end() || (*it)->stream != stream) return nullptr;
    // A request does not take a cached block from a much larger dedicated segment: that
    // would pin the rest. Shared 20 MiB segments serve any medium request.
    if ((*it)->size > kMediumSegment && (*it)->size > 2 * size + kLargeRounding) return nullptr;
    Block* block = *it;
    pool.erase(it);
    if (block->prev != nullptr || block->next != nullptr) {
      stat_sub(stats_.inactive_split, block->small, 1);
      stat_sub(stats_.inactive_split_bytes, block->small, block->size);
    }
    return block;
  }

  Block* new_segment(size_t size, c10::StreamId stream, bool small, size_t requested) {
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
        release_whole_segments(small_free_);
        release_whole_segments(large_free_);
        release_cached_on_other_devices(device_);
        status = nrt_mem_alloc(device_, bytes, &ptr);
      }
    }
    if (status == NRT_OUT_OF_MEMORY) {
      stats_.num_ooms += 1;
      throw_out_of_memory(requested, bytes);
    }
    NEURON_CHECK(status);
    stats_.num_device_alloc += 1;
    stat_add(stats_.segment, small, 1);
    stat_add(stats_.reserved_bytes, small, bytes);
    return new Block{device_, stream, bytes, ptr, small};
  }

  [[noreturn]] void throw_out_of_memory(size_t requested, size_t segment) {
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

  Block* split(Block* block, size_t size, BlockPool& pool) {
    const size_t remaining = block->size - size;
    const bool worth_splitting = block->small ? remaining >= kMinBlockSize : remaining > kSmallSize;
    if (!worth_splitting) return block;
    auto* rest = new Block{device_, block->stream, remaining, static_cast<char*>(block->ptr) + size,
                           block->small};
    rest->prev = block;
    rest->next = block->next;
    if (rest->next != nullptr) rest->next->prev = rest;
    block->next = rest;
    block->size = size;
    pool.insert(rest);
    stat_add(stats_.inactive_split, rest->small, 1);
    stat_add(stats_.inactive_split_bytes, rest->small, rest->size);
    return block;
  }

  void defer_until_streams_reach(Block* block) {
    for (c10::StreamId stream : block->stream_uses) {
      nrt_event_t event = nullptr;
      NEURON_CHECK(nrt_event_create(NRT_EVENT_DEFAULT, &event));
      NEURON_CHECK(nrt_event_record(event, device_, static_cast<int>(stream)));
      pending_.emplace_back(event, block);
      block->pending_events += 1;
    }
    block->stream_uses.clear();
  }

  void process_pending(bool wait) {
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

  void release_to_pool(Block* block) {
    stat_sub(stats_.active, block->small, 1);
    stat_sub(stats_.active_bytes, block->small, block->size);
    return_to_pool(block);
  }

  // Merges an inactive block with free neighbours into its pool.
  void return_to_pool(Block* block) {
    BlockPool& pool = block->small ? small_free_ : large_free_;
    merge_with(block, block->prev, pool);
    merge_with(block, block->next, pool);
    if (block->prev != nullptr || block->next != nullptr) {
      stat_add(stats_.inactive_split, block->small, 1);
      stat_add(stats_.inactive_split_bytes, block->small, block->size);
    }
    pool.insert(block);
  }

  void merge_with(Block* block, Block* neighbour, BlockPool& pool) {
    if (neighbour == nullptr || neighbour->allocated || neighbour->pending_events > 0) return;
    if (pool.erase(neighbour) == 0) return;  // it is not free in this pool
    stat_sub(stats_.inactive_split, neighbour->small, 1);
    stat_sub(stats_.inactive_split_bytes, neighbour->small, neighbour->size);
    if (neighbour == block->prev) {
      block->ptr = neighbour->ptr;
      block->prev = neighbour->prev;
      if (block->prev != nullptr) block->prev->next = block;
    } else {
      block->next = neighbour->next;
      if (block->next != nullptr) block->next->prev = block;
    }
    block->size += neighbour->size;
    delete neighbour;
  }

  void release_whole_segments(BlockPool& pool) {
    for (auto it = pool.begin(); it != pool.end();) {
      Block* block = *it;
      if (block->prev == nullptr && block->next == nullptr) {
        NEURON_CHECK(nrt_mem_free(device_, block->ptr));
        stats_.num_device_free += 1;
        stat_sub(stats_.segment, block->small, 1);
        stat_sub(stats_.reserved_bytes, block->small, block->size);
        it = pool.erase(it);
        delete block;
      } else {
        ++it;
      }
    }
  }

  c10::DeviceIndex device_;
  std::mutex mutex_;
  BlockPool small_free_;
  BlockPool large_free_;
  ska::flat_hash_map<void*, Block*> allocated_;
  std::deque<std::pair<nrt_event_t, Block*>> pending_;
  std::array<c10::SmallVector<Block*, kQuickDepth>, kQuickClasses> stash_;
  size_t stashed_ = 0;
  DeviceStats stats_;
};

std::vector<std::unique_ptr<DeviceCache>>& device_caches() {
  static std::vector<std::unique_ptr<DeviceCache>> caches = [] {
    std::vector<std::unique_ptr<DeviceCache>> result;
    const auto count = device_count();
    for (c10::DeviceIndex i = 0; i < count; ++i) result.push_back(std::make_unique<DeviceCache>(i));
    return result;
  }();
  return caches;
}

void release_cached_on_other_devices(c10::DeviceIndex except) {
  for (auto& cache : device_caches()) {
    if (cache.get() != device_caches()[static_cast<size_t>(except)].get()) cache->try_empty_cache();
  }
}

DeviceCache& cache_for(c10::DeviceIndex device) {
  check_device_index(device);
  return *device_caches()[static_cast<size_t>(device)];
}

thread_local std::vector<ReservedAllocations::Block>* tls_reserved = nullptr;
// The pool key of a stream worker's own allocations, or kNoWorkerPool.
constexpr c10::StreamId kNoWorkerPool = -1;
constexpr c10::StreamId kWorkerPoolBase = c10::StreamId{1} << 40;
thread_local c10::StreamId tls_worker_pool = kNoWorkerPool;

// A served reservation is released by its owner, never by the kernel it was lent to.
bool is_served_reservation(const void* ptr) {
  if (tls_reserved == nullptr) return false;
  for (const auto& block : *tls_reserved) {
    if (block.served && block.ptr == ptr) return true;
  }
  return false;
}

void release_reservation(void* /*ptr*/) {}

void free_device_memory(void* ptr) {
  if (ptr == nullptr || is_served_reservation(ptr)) return;
  for (auto& cache : device_caches()) {
    if (cache->free(ptr)) return;
  }
  TORCH_INTERNAL_ASSERT(false, "neuron caching allocator: freeing unknown pointer ", ptr);
}

CachingAllocator g_allocator;

}  // namespace

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_allocator)

CachingAllocator& caching_allocator() { return g_allocator; }

std::string format_bytes(uint64_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  char text[64];
  if (unit == 0) {
    std::snprintf(text, sizeof(text), "%llu bytes", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(text, sizeof(text), "%.2f %s", value, units[unit]);
  }
  return text;
}

c10::DataPtr CachingAllocator::allocate(size_t nbytes) {
  return allocate_on(current_device(), nbytes);
}

c10::DataPtr CachingAllocator::allocate_on(c10::DeviceIndex device, size_t nbytes) {
  // A forked child inherits the parent's cached blocks; it must not use them.
  if (C10_UNLIKELY(nrt_in_bad_fork())) NEURON_CHECK(NRT_FORKED_CHILD);
  const c10::Device where(c10::DeviceType::PrivateUse1, device);
  if (nbytes == 0) {
    check_device_index(device);
    return c10::DataPtr(nullptr, where);
  }
  if (C10_UNLIKELY(tls_reserved != nullptr)) {
    for (auto& reserved : *tls_reserved) {
      if (!reserved.served && reserved.nbytes == nbytes) {
        reserved.served = true;
        return c10::DataPtr(reserved.ptr, reserved.ptr, &release_reservation, where);
      }
    }
  }
  const c10::StreamId stream =
      tls_worker_pool != kNoWorkerPool ? tls_worker_pool : current_stream(device).id();
  Block* block = nullptr;
  try {
    block = cache_for(device).allocate(nbytes, stream);
  } catch (const c10::OutOfMemoryError&) {
    // Launched work holds memory until it completes (its arguments, results and scratch)
    // and blocks used on other streams wait for them: let it finish, then try once more.
    if (!async_launches() || on_stream_worker()) throw;
    wait_for_device_work();
    cache_for(device).process_pending_events();
    block = cache_for(device).allocate(nbytes, stream);
  }
  return c10::DataPtr(block->ptr, block->ptr, &free_device_memory, where);
}

c10::DeleterFnPtr CachingAllocator::raw_deleter() const { return &free_device_memory; }

void CachingAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  if (count > 0) std::memcpy(dest, src, count);
}

void CachingAllocator::count_external(c10::DeviceIndex device, size_t nbytes, bool mapped) {
  cache_for(device).count_external(nbytes, mapped);
}

bool CachingAllocator::owns(const c10::DataPtr& data_ptr) {
  return data_ptr.get_deleter() == &free_device_memory ||
         data_ptr.get_deleter() == &release_reservation;
}

bool CachingAllocator::free_if_owned(void* ptr) {
  if (ptr == nullptr || !nrt_is_initialized()) return false;
  if (is_served_reservation(ptr)) return true;
  for (auto& cache : device_caches()) {
    if (cache->free(ptr)) return true;
  }
  return false;
}

bool CachingAllocator::initialized() { return nrt_is_initialized() != 0; }

void CachingAllocator::emptyCache(c10::MempoolId_t /*mempool_id*/) {
  if (!initialized()) return;
  wait_for_device_work();  // launched work may still read free blocks
  for (auto& cache : device_caches()) cache->empty_cache();
}

void CachingAllocator::recordStream(const c10::DataPtr& ptr, c10::Stream stream) {
  if (ptr.get() == nullptr || !owns(ptr)) return;
  const bool known = cache_for(ptr.device().index()).record_stream(ptr.get(), stream.id());
  TORCH_INTERNAL_ASSERT(known, "recordStream on a pointer the neuron allocator does not own");
}

c10::CachingDeviceAllocator::DeviceStats CachingAllocator::getDeviceStats(c10::DeviceIndex device) {
  // Launched work holds its arguments until it completes: counting after it makes the
  // figures those of the program order, as on a device where a free is immediate.
  wait_for_device_work();
  return cache_for(resolve_device_index(device)).stats();
}

void CachingAllocator::resetAccumulatedStats(c10::DeviceIndex device) {
  cache_for(resolve_device_index(device)).reset_accumulated();
}

void CachingAllocator::resetPeakStats(c10::DeviceIndex device) {
  cache_for(resolve_device_index(device)).for_each_stat([](c10::CachingAllocator::Stat& s) {
    s.reset_peak();
  });
}

std::pair<size_t, size_t> CachingAllocator::getMemoryInfo(c10::DeviceIndex device) {
  device = resolve_device_index(device);
  uint64_t used = 0, capacity = 0;
  NEURON_CHECK(nrt_mem_get_info(device, &used, &capacity));
  return {static_cast<size_t>(capacity - used), static_cast<size_t>(capacity)};
}

ReservedAllocations::ReservedAllocations(std::vector<Block>* blocks, c10::StreamId stream)
    : previous_blocks_(tls_reserved), previous_pool_(tls_worker_pool) {
  tls_reserved = blocks;
  tls_worker_pool = kWorkerPoolBase + stream;
}

ReservedAllocations::~ReservedAllocations() {
  tls_reserved = previous_blocks_;
  tls_worker_pool = previous_pool_;
}

}  // namespace torchneuron
