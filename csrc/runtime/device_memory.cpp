#include "device_memory.h"

#include <sys/mman.h>

#include <cstdlib>
#include <utility>

#include "bytes.h"
#include "error.h"
#include "host_budget.h"
#include "runtime_state.h"

namespace nrt {
namespace {

constexpr size_t kMmapThreshold = 256 * 1024;
constexpr size_t kAlignment = 64;

void* os_allocate(size_t nbytes) {
  if (nbytes >= kMmapThreshold) {
    void* ptr = mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return ptr == MAP_FAILED ? nullptr : ptr;
  }
  if (nbytes > SIZE_MAX - kAlignment) return nullptr;
  return std::aligned_alloc(kAlignment, (nbytes + kAlignment - 1) / kAlignment * kAlignment);
}

void os_free(void* ptr, size_t nbytes) {
  if (nbytes >= kMmapThreshold) {
    munmap(ptr, nbytes);
  } else {
    std::free(ptr);
  }
}

}  // namespace

DeviceArena::DeviceArena(std::string label, uint64_t capacity)
    : label_(std::move(label)), capacity_(capacity) {}

DeviceArena::~DeviceArena() {
  for (const auto& entry : allocations_) {
    os_free(entry.first, entry.second);
    host_budget_release(entry.second);
  }
}

std::string DeviceArena::describe_usage(uint64_t used) const {
  return format_bytes(used) + " of " + format_bytes(capacity_) + " capacity in use, " +
         format_bytes(capacity_ - used) + " free";
}

nrt_status DeviceArena::allocate(size_t nbytes, void** out) {
  const uint64_t size = nbytes;
  const std::string request = label_ + " out of memory: tried to allocate " + format_bytes(size);
  uint64_t used_now = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (size > capacity_ - used_) {
      return fail(NRT_OUT_OF_MEMORY, request + "; " + describe_usage(used_) + " on " + label_);
    }
    used_ += size;
    used_now = used_;
  }
  auto undo = [&] {
    std::lock_guard<std::mutex> lock(mutex_);
    used_ -= size;
  };
  if (!host_budget_try_reserve(size)) {
    undo();
    return fail(NRT_OUT_OF_MEMORY,
                request + "; the host memory budget shared by all devices has " +
                    format_bytes(host_budget_used()) + " of " + format_bytes(host_budget_bytes()) +
                    " in use (raise TORCHNEURON_HOST_MEMORY_BUDGET or free memory on any "
                    "device); " +
                    label_ + " has " + describe_usage(used_now - size));
  }
  void* ptr = os_allocate(nbytes);
  if (ptr == nullptr) {
    host_budget_release(size);
    undo();
    return fail(NRT_OUT_OF_MEMORY, request + "; the operating system refused the host memory");
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    allocations_.emplace(ptr, nbytes);
  }
  *out = ptr;
  return NRT_SUCCESS;
}

nrt_status DeviceArena::release(void* ptr) {
  size_t nbytes = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = allocations_.find(ptr);
    if (it == allocations_.end()) {
      return fail(NRT_INVALID_HANDLE,
                  "nrt_mem_free: pointer was not allocated on " + label_ + " (or already freed)");
    }
    nbytes = it->second;
    allocations_.erase(it);
    used_ -= nbytes;
  }
  os_free(ptr, nbytes);
  host_budget_release(nbytes);
  return NRT_SUCCESS;
}

uint64_t DeviceArena::used() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return used_;
}

}  // namespace nrt

extern "C" nrt_status nrt_mem_alloc(int device, size_t nbytes, void** out_ptr) {
  if (out_ptr == nullptr) return nrt::fail(NRT_INVALID_ARGUMENT, "nrt_mem_alloc: out_ptr is NULL");
  *out_ptr = nullptr;
  nrt::Device* dev = nullptr;
  if (nrt_status status = nrt::lookup_device(device, &dev)) return status;
  if (nbytes == 0) return NRT_SUCCESS;
  return dev->arena.allocate(nbytes, out_ptr);
}

extern "C" nrt_status nrt_mem_free(int device, void* ptr) {
  nrt::Device* dev = nullptr;
  if (nrt_status status = nrt::lookup_device(device, &dev)) return status;
  if (ptr == nullptr) return NRT_SUCCESS;
  return dev->arena.release(ptr);
}

extern "C" nrt_status nrt_mem_get_info(int device, uint64_t* used_bytes, uint64_t* capacity_bytes) {
  nrt::Device* dev = nullptr;
  if (nrt_status status = nrt::lookup_device(device, &dev)) return status;
  if (used_bytes != nullptr) *used_bytes = dev->arena.used();
  if (capacity_bytes != nullptr) *capacity_bytes = dev->arena.capacity();
  return NRT_SUCCESS;
}
