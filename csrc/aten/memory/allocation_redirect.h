// Host kernels allocate their outputs and scratch through c10's CPU allocator. While a
// neuron op runs them, this redirect serves those allocations from the op's device memory,
// so results are born in device memory and adopted by neuron tensors without a copy.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

namespace torchneuron {

// The CPU allocator that host-kernel aliases of device tensors use for reallocation.
c10::Allocator* redirecting_cpu_allocator();

// While alive, CPU allocations on this thread come from `device`'s memory.
class DeviceAllocationScope {
 public:
  explicit DeviceAllocationScope(c10::DeviceIndex device);
  ~DeviceAllocationScope();
  DeviceAllocationScope(const DeviceAllocationScope&) = delete;
  DeviceAllocationScope& operator=(const DeviceAllocationScope&) = delete;

 private:
  c10::DeviceIndex previous_;
};

}  // namespace torchneuron
