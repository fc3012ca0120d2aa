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
  // Returns a pointer from allocate(); NRT_INVALID_HANDLE for any other pointer.
  nrt_status release(void* ptr);

  uint64_t used() const;
  uint64_t capacity() const { return capacity_; }

 private:
  std::string describe_usage(uint64_t used) const;

  const std::string label_;
  const uint64_t capacity_;
  mutable std::mutex mutex_;
  uint64_t used_ = 0;                              // guarded by mutex_
  std::unordered_map<void*, size_t> allocations_;  // guarded by mutex_
};

}  // namespace nrt
