// The calling thread's current neuron device and the visible device count (device_state.h),
// with the checks of device indices the rest of csrc/aten uses.
#include "device/device_state.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>

#include "device/runtime_status.h"

namespace torchneuron {
namespace {
thread_local c10::DeviceIndex tls_current_device = 0;
// The topology is fixed once the runtime initialised; cache it off the dispatch hot path.
std::atomic<int> cached_device_count{-1};
}  // namespace

c10::DeviceIndex device_count() {
  int count = cached_device_count.load(std::memory_order_relaxed);
  if (C10_LIKELY(count >= 0)) return static_cast<c10::DeviceIndex>(count);
  NEURON_CHECK(nrt_device_count(&count));
  cached_device_count.store(count, std::memory_order_relaxed);
  return static_cast<c10::DeviceIndex>(count);
}

c10::DeviceIndex device_count_or_zero() noexcept {
  const int cached = cached_device_count.load(std::memory_order_relaxed);
  if (cached >= 0) return static_cast<c10::DeviceIndex>(cached);
  int count = 0;
  return nrt_device_count(&count) == NRT_SUCCESS ? static_cast<c10::DeviceIndex>(count) : 0;
}

namespace {
[[noreturn]] void invalid_device_index(int64_t index, int count) {
  TORCH_CHECK_INDEX(false, "neuron:", index, " is not a valid device: this process sees ", count,
                    " neuron device(s), so use an index from 0 to ", count - 1,
                    " (NEURON_RT_VISIBLE_CORES and NEURON_LOGICAL_NC_CONFIG decide how many "
                    "there are).");
  std::abort();  // unreachable: TORCH_CHECK_INDEX(false, ...) throws
}
}  // namespace

void check_device_index(c10::DeviceIndex index) {
  const auto count = device_count();
  if (C10_LIKELY(index >= 0 && index < count)) return;
  invalid_device_index(index, static_cast<int>(count));
}

c10::DeviceIndex checked_device_index(int64_t index, bool allow_current) {
  const auto count = device_count();
  if (index == -1 && allow_current) return tls_current_device;
  if (index < 0 || index >= count) invalid_device_index(index, static_cast<int>(count));
  return static_cast<c10::DeviceIndex>(index);
}

c10::DeviceIndex current_device() { return tls_current_device; }

void set_device(c10::DeviceIndex index) {
  if (index == tls_current_device && cached_device_count.load(std::memory_order_relaxed) > index) {
    return;
  }
  check_device_index(index);
  tls_current_device = index;
}

c10::DeviceIndex resolve_device_index(c10::DeviceIndex index) {
  if (index < 0) {
    return tls_current_device;
  }
  check_device_index(index);
  return index;
}

}  // namespace torchneuron
