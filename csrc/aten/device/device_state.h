// The calling thread's current neuron device and the visible device count.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

namespace torchneuron {

// Initialises the runtime on first use; raises the runtime's configuration error if the
// environment (chip profile, logical-core grouping, visible cores) is invalid.
c10::DeviceIndex device_count();
// Like device_count(), but 0 instead of an error (for noexcept callers).
c10::DeviceIndex device_count_or_zero() noexcept;
c10::DeviceIndex current_device();
void set_device(c10::DeviceIndex index);
// Raises an IndexError that names the valid range when index is out of range.
void check_device_index(c10::DeviceIndex index);
// A device index given as a wide integer (from Python), checked before it is narrowed to
// c10::DeviceIndex, so 1000 is refused as neuron:1000 rather than wrapped to neuron:-24.
// -1 means the current device when allow_current is set.
c10::DeviceIndex checked_device_index(int64_t index, bool allow_current = false);
// -1 means "the current device".
c10::DeviceIndex resolve_device_index(c10::DeviceIndex index);

}  // namespace torchneuron
