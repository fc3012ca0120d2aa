// The device memory allocator (caching_allocator.h): c10's allocator interface over the
// per-device caches (device_cache.h), the reservations that stream workers serve launched
// work from, and the deleter that returns a block to its device's cache.
#include "memory/caching_allocator.h"

#include <c10/util/Exception.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "device/device_state.h"
#include "device/runtime_status.h"
#include "device/stream_state.h"
#include "launch/async_launch.h"
#include "memory/device_cache.h"

namespace torchneuron {
namespace {

using cache::DeviceCache;

std::vector<std::unique_ptr<DeviceCache>>& device_caches() {
  static std::vector<std::unique_ptr<DeviceCache>> caches = [] {
    std::vector<std::unique_ptr<DeviceCache>> result;
    const auto count = device_count();
    for (c10::DeviceIndex i = 0; i < count; ++i) result.push_back(std::make_unique<DeviceCache>(i));
    return result;
  }();
  return caches;
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

namespace cache {

void release_cached_on_other_devices(c10::DeviceIndex except) {
  for (auto& cache : device_caches()) {
    if (cache.get() != device_caches()[static_cast<size_t>(except)].get()) cache->try_empty_cache();
  }
}

}  // namespace cache

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
  cache::Block* block = nullptr;
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
