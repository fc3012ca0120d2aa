// Device memory (device_memory.h): each device's arena of host memory with exact capacity
// accounting, and the nrt_mem_* calls, shared memory included.
#include "device_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "bytes.h"
#include "error.h"
#include "host_budget.h"
#include "runtime_state.h"
#include "shared_file.h"

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
    unmap(const_cast<void*>(entry.first), entry.second);
    host_budget_release(entry.second.nbytes);
  }
}

std::string DeviceArena::describe_usage(uint64_t used) const {
  return format_bytes(used) + " of " + format_bytes(capacity_) + " capacity in use, " +
         format_bytes(capacity_ - used) + " free";
}

nrt_status DeviceArena::charge(size_t nbytes, const char* what) {
  const uint64_t size = nbytes;
  const std::string request =
      label_ + " out of memory: tried to allocate " + format_bytes(size) + what;
  uint64_t used_now = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (size > capacity_ - used_) {
      return fail(NRT_OUT_OF_MEMORY, request + "; " + describe_usage(used_) + " on " + label_);
    }
    used_ += size;
    used_now = used_;
  }
  if (!host_budget_try_reserve(size)) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      used_ -= size;
    }
    return fail(NRT_OUT_OF_MEMORY,
                request + "; the host memory budget shared by all devices has " +
                    format_bytes(host_budget_used()) + " of " + format_bytes(host_budget_bytes()) +
                    " in use (raise TORCHNEURON_HOST_MEMORY_BUDGET or free memory on any "
                    "device); " +
                    label_ + " has " + describe_usage(used_now - size));
  }
  return NRT_SUCCESS;
}

void DeviceArena::uncharge(size_t nbytes) {
  host_budget_release(nbytes);
  std::lock_guard<std::mutex> lock(mutex_);
  used_ -= nbytes;
}

void DeviceArena::record(void* ptr, Allocation allocation) {
  std::lock_guard<std::mutex> lock(mutex_);
  allocations_.emplace(ptr, allocation);
}

void DeviceArena::unmap(void* ptr, const Allocation& allocation) {
  if (allocation.fd < 0) {
    os_free(ptr, allocation.nbytes);
    return;
  }
  munmap(ptr, allocation.nbytes);
  close(allocation.fd);
}

nrt_status DeviceArena::allocate(size_t nbytes, void** out) {
  if (nrt_status status = charge(nbytes, "")) return status;
  void* ptr = os_allocate(nbytes);
  if (ptr == nullptr) {
    uncharge(nbytes);
    return fail(NRT_OUT_OF_MEMORY, label_ + " out of memory: tried to allocate " +
                                       format_bytes(nbytes) +
                                       "; the operating system refused the host memory");
  }
  record(ptr, {nbytes, -1});
  *out = ptr;
  return NRT_SUCCESS;
}

nrt_status DeviceArena::allocate_shared(size_t nbytes, void** out, int* out_fd) {
  if (nrt_status status = charge(nbytes, " of shared memory")) return status;
  int fd = -1;
  void* ptr = nullptr;
  nrt_status status = shared_file_create("torchneuron-shared:" + label_, nbytes, &fd);
  if (status == NRT_SUCCESS) {
    status = shared_file_map(fd, nbytes, &ptr);
    if (status != NRT_SUCCESS) close(fd);
  }
  if (status != NRT_SUCCESS) {
    uncharge(nbytes);
    return status;
  }
  record(ptr, {nbytes, fd});
  *out = ptr;
  *out_fd = fd;
  return NRT_SUCCESS;
}

nrt_status DeviceArena::import_shared(int fd, size_t nbytes, void** out, int* out_fd) {
  if (nrt_status status = shared_file_check(fd, nbytes)) return status;
  if (nrt_status status = charge(nbytes, " to map shared memory")) return status;
  const int own_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  void* ptr = nullptr;
  nrt_status status = NRT_SUCCESS;
  if (own_fd < 0) {
    status = fail(NRT_OUT_OF_MEMORY, std::string("duplicating a shared memory descriptor: ") +
                                         std::strerror(errno) + " (raise `ulimit -n`)");
  } else {
    status = shared_file_map(own_fd, nbytes, &ptr);
    if (status != NRT_SUCCESS) close(own_fd);
  }
  if (status != NRT_SUCCESS) {
    uncharge(nbytes);
    return status;
  }
  record(ptr, {nbytes, own_fd});
  *out = ptr;
  *out_fd = own_fd;
  return NRT_SUCCESS;
}

nrt_status DeviceArena::shared_fd(const void* ptr, int* out_fd) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocations_.find(ptr);
  if (it == allocations_.end() || it->second.fd < 0) {
    return fail(NRT_INVALID_HANDLE, "pointer is not shared memory of " + label_);
  }
  *out_fd = it->second.fd;
  return NRT_SUCCESS;
}

nrt_status DeviceArena::release(void* ptr) {
  Allocation allocation{};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = allocations_.find(ptr);
    if (it == allocations_.end()) {
      return fail(NRT_INVALID_HANDLE,
                  "nrt_mem_free: pointer was not allocated on " + label_ + " (or already freed)");
    }
    allocation = it->second;
    allocations_.erase(it);
  }
  unmap(ptr, allocation);
  uncharge(allocation.nbytes);
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

extern "C" nrt_status nrt_mem_alloc_shared(int device, size_t nbytes, void** out_ptr, int* out_fd) {
  if (out_ptr == nullptr || out_fd == nullptr) {
    return nrt::fail(NRT_INVALID_ARGUMENT, "nrt_mem_alloc_shared: out_ptr or out_fd is NULL");
  }
  *out_ptr = nullptr;
  *out_fd = -1;
  nrt::Device* dev = nullptr;
  if (nrt_status status = nrt::lookup_device(device, &dev)) return status;
  if (nbytes == 0) {
    return nrt::fail(NRT_INVALID_ARGUMENT, "nrt_mem_alloc_shared: shared memory needs nbytes > 0");
  }
  return dev->arena.allocate_shared(nbytes, out_ptr, out_fd);
}

extern "C" nrt_status nrt_mem_import_shared(int device, int fd, size_t nbytes, void** out_ptr,
                                            int* out_fd) {
  if (out_ptr == nullptr || out_fd == nullptr) {
    return nrt::fail(NRT_INVALID_ARGUMENT, "nrt_mem_import_shared: out_ptr or out_fd is NULL");
  }
  *out_ptr = nullptr;
  *out_fd = -1;
  nrt::Device* dev = nullptr;
  if (nrt_status status = nrt::lookup_device(device, &dev)) return status;
  if (nbytes == 0 || fd < 0) {
    return nrt::fail(NRT_INVALID_ARGUMENT, "nrt_mem_import_shared: needs fd >= 0 and nbytes > 0");
  }
  return dev->arena.import_shared(fd, nbytes, out_ptr, out_fd);
}

extern "C" nrt_status nrt_mem_shared_fd(int device, const void* ptr, int* out_fd) {
  if (out_fd == nullptr)
    return nrt::fail(NRT_INVALID_ARGUMENT, "nrt_mem_shared_fd: out_fd is NULL");
  *out_fd = -1;
  nrt::Device* dev = nullptr;
  if (nrt_status status = nrt::lookup_device(device, &dev)) return status;
  return dev->arena.shared_fd(ptr, out_fd);
}
