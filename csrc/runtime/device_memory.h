// One device's memory arena: host memory handed out with exact capacity accounting.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

#include "neuron_runtime.h"

namespace nrt {

class DeviceArena {
 public:
  // `label` names the device in messages ("neuron:0"); `capacity` is in bytes.
  DeviceArena(std::string label, uint64_t capacity);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // Allocates nbytes (> 0), 64-byte aligned at least, charging the device and the host
  // budget. NRT_OUT_OF_MEMORY with a message when either is exhausted or the OS refuses.
  nrt_status allocate(size_t nbytes, void** out);
  // Allocates nbytes (> 0) that other processes can map: a sealed memory file mapped
  // shared (see shared_file.h). *out_fd stays owned by the arena until release().
  nrt_status allocate_shared(size_t nbytes, void** out, int* out_fd);
  // Maps shared memory another process allocated (fd is duplicated, not taken), charging
  // this process's device and host budget as an allocation of its own.
  nrt_status import_shared(int fd, size_t nbytes, void** out, int* out_fd);
  // The memory file behind a shared allocation; NRT_INVALID_HANDLE for other pointers.
  nrt_status shared_fd(const void* ptr, int* out_fd) const;
  // Returns a pointer from allocate*() or import_shared(); NRT_INVALID_HANDLE for any other.
  nrt_status release(void* ptr);

  uint64_t used() const;
  uint64_t capacity() const { return capacity_; }

 private:
  struct Allocation {
    size_t nbytes;
    int fd;  // the memory file of a shared allocation, -1 for private memory
  };

  std::string describe_usage(uint64_t used) const;
  // Charges nbytes to the device and the host budget, or says why not.
  nrt_status charge(size_t nbytes, const char* what);
  void uncharge(size_t nbytes);
  void record(void* ptr, Allocation allocation);
  static void unmap(void* ptr, const Allocation& allocation);

  const std::string label_;
  const uint64_t capacity_;
  mutable std::mutex mutex_;
  uint64_t used_ = 0;                                        // guarded by mutex_
  std::unordered_map<const void*, Allocation> allocations_;  // guarded by mutex_
};

}  // namespace nrt
