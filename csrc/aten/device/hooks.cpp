// ATen's PrivateUse1 hooks: availability, lazy initialisation, device selection, default
// generators, pinned memory and storage resizing for the neuron device.
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/StorageImpl.h>

#include "device/device_state.h"
#include "device/generator.h"
#include "device/runtime_status.h"
#include "memory/caching_allocator.h"
#include "memory/device_storage.h"
#include "memory/host_allocator.h"

namespace torchneuron {
namespace {

struct NeuronHooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return device_count_or_zero() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex /*device_index*/) const override {
    return nrt_is_initialized() != 0;
  }
  void init() const override { NEURON_CHECK(nrt_init()); }
  c10::DeviceIndex deviceCount() const override { return device_count_or_zero(); }
  void setCurrentDevice(c10::DeviceIndex device) const override { set_device(device); }
  c10::DeviceIndex getCurrentDevice() const override { return current_device(); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    const c10::DeviceIndex previous = current_device();
    if (device != previous) set_device(device);
    return previous;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return default_generator(device_index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    return new_generator(device_index);
  }
  at::Device getDeviceFromPtr(void* /*data*/) const override {
    return at::Device(c10::DeviceType::PrivateUse1, current_device());
  }
  bool isPinnedPtr(const void* data) const override { return is_pinned_host_pointer(data); }
  at::Allocator* getPinnedMemoryAllocator() const override { return &host_allocator(); }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    resize_device_storage(storage.unsafeGetStorageImpl(), newsize);
  }
};

}  // namespace

void register_hooks() {
  static NeuronHooks hooks;
  static bool registered = [] {
    at::RegisterPrivateUse1HooksInterface(&hooks);
    return true;
  }();
  (void)registered;
}

}  // namespace torchneuron
