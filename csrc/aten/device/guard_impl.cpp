// c10's device guard for neuron: current device, streams and events, so that
// torch.neuron/torch.accelerator device and stream calls, torch.Stream and torch.Event work.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>

#include "device/device_state.h"
#include "device/runtime_status.h"
#include "device/stream_state.h"
#include "launch/async_launch.h"
#include "memory/caching_allocator.h"

namespace torchneuron {
namespace {

constexpr auto kNeuron = c10::DeviceType::PrivateUse1;

nrt_event_t as_event(void* event) { return static_cast<nrt_event_t>(event); }

struct NeuronGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kNeuron; }

  c10::Device exchangeDevice(c10::Device device) const override {
    const c10::Device previous = getDevice();
    if (device.index() != previous.index()) set_device(device.index());
    return previous;
  }

  c10::Device getDevice() const override { return c10::Device(kNeuron, current_device()); }

  void setDevice(c10::Device device) const override { set_device(device.index()); }

  void uncheckedSetDevice(c10::Device device) const noexcept override {
    try {
      set_device(device.index());
    } catch (...) {
      // Restoring a device that was valid before cannot fail; nothing to do otherwise.
    }
  }

  c10::Stream getStream(c10::Device device) const override {
    return current_stream(device.index());
  }

  c10::Stream getDefaultStream(c10::Device device) const override {
    return default_stream(device.index());
  }

  c10::Stream getStreamFromGlobalPool(c10::Device device, bool is_high_priority) const override {
    return pooled_stream(device.index(), is_high_priority ? -1 : 0);
  }

  c10::Stream getNewStream(c10::Device device, int priority) const override {
    return new_stream(device.index(), priority);
  }

  c10::Stream exchangeStream(c10::Stream stream) const override { return exchange_stream(stream); }

  c10::DeviceIndex deviceCount() const noexcept override { return device_count_or_zero(); }

  // Every dtype PyTorch's CPU kernels support runs on the device.
  c10::DeviceCapability getDeviceCapability(c10::Device /*device*/) const override {
    return c10::DeviceCapability();
  }

  void destroyEvent(void* event, const c10::DeviceIndex /*device_index*/) const noexcept override {
    if (event != nullptr) nrt_event_destroy(as_event(event));
  }

  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    TORCH_CHECK(device_index == -1 || device_index == stream.device_index(), "Event device index ",
                static_cast<int>(device_index), " does not match the recording stream's device ",
                stream.device(), "; record the event on a stream of its own device.");
    if (*event == nullptr) {
      nrt_event_t created = nullptr;
      // BACKEND_DEFAULT is what torch.Event(enable_timing=True) asks for.
      const unsigned flags =
          flag == c10::EventFlag::BACKEND_DEFAULT ? NRT_EVENT_TIMING : NRT_EVENT_DEFAULT;
      NEURON_CHECK(nrt_event_create(flags, &created));
      *event = created;
    }
    NEURON_CHECK(
        nrt_event_record(as_event(*event), stream.device_index(), static_cast<int>(stream.id())));
  }

  void block(void* event, const c10::Stream& stream) const override {
    if (event == nullptr) return;
    NEURON_CHECK(nrt_stream_wait_event(stream.device_index(), static_cast<int>(stream.id()),
                                       as_event(event)));
  }

  bool queryEvent(void* event) const override {
    if (event == nullptr) return true;
    const nrt_status status = nrt_event_query(as_event(event));
    if (status == NRT_NOT_READY) return false;
    NEURON_CHECK(status);
    return true;
  }

  bool queryStream(const c10::Stream& stream) const override {
    const nrt_status status =
        nrt_stream_query(stream.device_index(), static_cast<int>(stream.id()));
    if (status == NRT_NOT_READY) return false;
    NEURON_CHECK(status);
    return true;
  }

  // Synchronizing raises an error that launched work hit (async_launch.h).
  void synchronizeStream(const c10::Stream& stream) const override {
    nrt_status status = NRT_SUCCESS;
    {
      const WaitingWithoutGil no_gil;
      status = nrt_stream_synchronize(stream.device_index(), static_cast<int>(stream.id()));
    }
    NEURON_CHECK(status);
    raise_launch_error();
  }

  void synchronizeEvent(void* event) const override {
    if (event != nullptr) {
      nrt_status status = NRT_SUCCESS;
      {
        const WaitingWithoutGil no_gil;
        status = nrt_event_synchronize(as_event(event));
      }
      NEURON_CHECK(status);
    }
    raise_launch_error();
  }

  void synchronizeDevice(const c10::DeviceIndex device_index) const override {
    const c10::DeviceIndex device = resolve_device_index(device_index);
    nrt_status status = NRT_SUCCESS;
    {
      const WaitingWithoutGil no_gil;
      status = nrt_device_synchronize(device);
    }
    NEURON_CHECK(status);
    raise_launch_error();
  }

  void recordDataPtrOnStream(const c10::DataPtr& data_ptr,
                             const c10::Stream& stream) const override {
    caching_allocator().recordStream(data_ptr, stream);
  }

  double elapsedTime(void* start, void* end,
                     const c10::DeviceIndex /*device_index*/) const override {
    TORCH_CHECK(start != nullptr && end != nullptr,
                "Both events must be recorded before measuring elapsed time.");
    double ms = 0.0;
    NEURON_CHECK(nrt_event_elapsed_ms(as_event(start), as_event(end), &ms));
    return ms;
  }
};

}  // namespace

C10_REGISTER_GUARD_IMPL(PrivateUse1, NeuronGuardImpl);

}  // namespace torchneuron
