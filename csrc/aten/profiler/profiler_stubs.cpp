// Device events for the legacy profiler path: torch.autograd.profiler.profile(use_device=
// "neuron") without Kineto (ProfilerState.KINETO_PRIVATEUSE1_FALLBACK) records a device
// event on the current stream as each op begins and ends and reports the time between them
// as the op's device time. Without these stubs PyTorch's placeholder throws inside the
// op-enter callback before the op's start time is stamped, and the profile shows times of
// about -7e16 us. An event is recorded on the op's stream and stamped when the stream
// reaches it (at once for inline launches; when the stream worker has done the work launched
// before it for asynchronous ones), so the time between two events is the stream's.
#include <c10/core/DeviceGuard.h>
#include <c10/util/ApproximateClock.h>
#include <c10/util/irange.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <memory>

#include "device/device_state.h"
#include "device/runtime_status.h"
#include "device/stream_state.h"

namespace torchneuron {
namespace {

using torch::profiler::impl::ProfilerVoidEventStub;

nrt_event_t as_event(const ProfilerVoidEventStub& stub) {
  return static_cast<nrt_event_t>(stub.get());
}

class NeuronProfilerStubs final : public torch::profiler::impl::ProfilerStubs {
 public:
  // Never throws: PyTorch calls this from the op-enter callback without catching, and an
  // exception there leaves the op without a start time. A failure is reported once and the
  // event left empty, which elapsed() reads as 0.
  void record(c10::DeviceIndex* device, ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    if (cpu_ns != nullptr) *cpu_ns = c10::getTime();
    try {
      const c10::DeviceIndex index = current_device();
      if (device != nullptr) *device = index;
      nrt_event_t created = nullptr;
      NEURON_CHECK(nrt_event_create(NRT_EVENT_TIMING, &created));
      *event = std::shared_ptr<void>(
          created, [](void* e) { nrt_event_destroy(static_cast<nrt_event_t>(e)); });
      NEURON_CHECK(nrt_event_record(created, index, static_cast<int>(current_stream(index).id())));
    } catch (const c10::Error& e) {
      event->reset();
      TORCH_WARN_ONCE("neuron profiler: could not record a device event, so device times read 0: ",
                      e.what_without_backtrace());
    }
  }

  // Microseconds between two events (0 if either was never recorded, as PyTorch expects).
  float elapsed(const ProfilerVoidEventStub* start,
                const ProfilerVoidEventStub* end) const override {
    if (start == nullptr || end == nullptr || !*start || !*end) return 0.0f;
    NEURON_CHECK(nrt_event_synchronize(as_event(*start)));
    NEURON_CHECK(nrt_event_synchronize(as_event(*end)));
    double ms = 0.0;
    NEURON_CHECK(nrt_event_elapsed_ms(as_event(*start), as_event(*end), &ms));
    return static_cast<float>(ms * 1000.0);
  }

  // Range markers are for external tracers (NVTX-like); the software device has none.
  void mark(const char* /*name*/) const override {}
  void rangePush(const char* /*name*/) const override {}
  void rangePop() const override {}

  void onEachDevice(std::function<void(int)> op) const override {
    c10::OptionalDeviceGuard guard;
    for (const c10::DeviceIndex i : c10::irange(device_count())) {
      guard.reset_device(c10::Device(c10::DeviceType::PrivateUse1, i));
      op(i);
    }
  }

  void synchronize() const override {
    for (const c10::DeviceIndex i : c10::irange(device_count())) {
      NEURON_CHECK(nrt_device_synchronize(i));
    }
  }

  bool enabled() const override { return true; }
};

struct RegisterStubs {
  RegisterStubs() {
    static NeuronProfilerStubs stubs;
    torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  }
};

// At load, before any profile can start.
const RegisterStubs g_register_stubs;

}  // namespace
}  // namespace torchneuron
