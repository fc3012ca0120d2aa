// The pinned host allocator (host_allocator.h): page-locked blocks cached by size.
#include "memory/host_allocator.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace torchneuron {
namespace {

constexpr size_t kAlignment = 4096;

class PinnedHostAllocator final : public at::HostAllocator {
 public:
  at::DataPtr allocate(size_t nbytes) override {
    if (nbytes == 0) return at::DataPtr(nullptr, at::Device(at::kCPU));
    const size_t size = round_up(nbytes);
    void* ptr = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = free_.find(size);
      if (it != free_.end()) {
        ptr = it->second;
        free_.erase(it);
        cached_bytes_ -= size;
      }
    }
    if (ptr == nullptr) {
      ptr = std::aligned_alloc(kAlignment, size);
      TORCH_CHECK_WITH(OutOfMemoryError, ptr != nullptr, "cannot allocate ", size,
                       " bytes of pinned host memory");
      mlock(ptr, size);  // best effort: RLIMIT_MEMLOCK may refuse, and that is harmless here
      std::lock_guard<std::mutex> lock(mutex_);
      stats_.num_host_alloc += 1;
      stats_.allocations.increase(1);
      stats_.allocated_bytes.increase(size);
    }
    std::lock_guard<std::mutex> lock(mutex_);
    live_.emplace(ptr, size);
    stats_.active_requests.increase(1);
    stats_.active_bytes.increase(size);
    return at::DataPtr(ptr, ptr, &release, at::Device(at::kCPU));
  }

  at::DeleterFnPtr raw_deleter() const override { return &release; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count > 0) std::memcpy(dest, src, count);
  }

  bool record_event(void* /*ptr*/, void* /*ctx*/, c10::Stream /*stream*/) override {
    // Copies complete before the copy call returns (blocking runtime), so nothing to track.
    return true;
  }

  void empty_cache() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [size, ptr] : free_) {
      munlock(ptr, size);
      std::free(ptr);
      stats_.num_host_free += 1;
      stats_.allocations.decrease(1);
      stats_.allocated_bytes.decrease(size);
    }
    free_.clear();
    cached_bytes_ = 0;
  }

  at::HostStats get_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void reset_accumulated_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto* stat : {&stats_.active_requests, &stats_.active_bytes, &stats_.allocations,
                       &stats_.allocated_bytes}) {
      stat->reset_accumulated();
    }
    stats_.num_host_alloc = 0;
    stats_.num_host_free = 0;
  }

  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto* stat : {&stats_.active_requests, &stats_.active_bytes, &stats_.allocations,
                       &stats_.allocated_bytes}) {
      stat->reset_peak();
    }
  }

  bool owns(const void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.upper_bound(ptr);
    if (it == live_.begin()) return false;
    --it;
    return static_cast<const char*>(ptr) < static_cast<const char*>(it->first) + it->second;
  }

  void give_back(void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(ptr);
    TORCH_INTERNAL_ASSERT(it != live_.end(), "pinned host allocator: unknown pointer");
    const size_t size = it->second;
    live_.erase(it);
    stats_.active_requests.decrease(1);
    stats_.active_bytes.decrease(size);
    free_.emplace(size, ptr);
    cached_bytes_ += size;
  }

 private:
  static size_t round_up(size_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }
  static void release(void* ptr);

  std::mutex mutex_;
  std::map<const void*, size_t> live_;
  std::multimap<size_t, void*> free_;
  size_t cached_bytes_ = 0;
  at::HostStats stats_;
};

PinnedHostAllocator g_host_allocator;

void PinnedHostAllocator::release(void* ptr) {
  if (ptr != nullptr) g_host_allocator.give_back(ptr);
}

}  // namespace

REGISTER_HOST_ALLOCATOR(at::kPrivateUse1, &g_host_allocator)

at::HostAllocator& host_allocator() { return g_host_allocator; }

bool is_pinned_host_pointer(const void* ptr) { return g_host_allocator.owns(ptr); }

}  // namespace torchneuron
