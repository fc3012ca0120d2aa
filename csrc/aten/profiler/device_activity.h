// The device's side of a profile: which kernels and copies ran on which neuron stream, and
// when. A kernel's device time is the span during which its host kernel ran over device
// memory, on the launching thread or, when launched asynchronously, on the stream's worker. While
// no profiler collects, a span costs one relaxed atomic load.
#pragma once

#include <c10/core/Device.h>
#include <c10/macros/Macros.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace torchneuron {

enum class DeviceActivityKind { kKernel, kMemcpy };

struct DeviceActivity {
  DeviceActivityKind kind;
  std::string name;
  c10::DeviceIndex device;
  int64_t stream;
  int64_t start_ns;  // nanoseconds since the Unix epoch: the profiler's timeline
  int64_t end_ns;
  uint64_t correlation;  // the profiled op that launched it (0: none)
};

namespace detail {
extern std::atomic<bool> g_device_tracing;
}  // namespace detail

inline bool device_tracing() { return detail::g_device_tracing.load(std::memory_order_relaxed); }

// Starts collecting, dropping anything collected before; stop returns what was collected.
void start_device_tracing();
std::vector<DeviceActivity> stop_device_tracing();

// The profiler's correlation ids of the ops running on this thread, innermost last. Work a
// span records is attributed to the innermost op when the span begins.
void push_launch_correlation(uint64_t id);
void pop_launch_correlation();
// The innermost op's correlation id on this thread (0: none), for work launched to run on
// another thread (a stream worker), which pushes it while it runs that work.
uint64_t current_launch_correlation();

// Records one activity covering its lifetime. Spans nested on one thread (an op that runs
// other neuron ops) record only the outermost, so device time is not counted twice.
class DeviceActivitySpan {
 public:
  DeviceActivitySpan(DeviceActivityKind kind, const char* name, c10::DeviceIndex device) {
    if (C10_UNLIKELY(device_tracing())) begin(kind, name, device);
  }
  ~DeviceActivitySpan() {
    if (C10_UNLIKELY(state_ != State::kIdle)) finish();
  }
  DeviceActivitySpan(const DeviceActivitySpan&) = delete;
  DeviceActivitySpan& operator=(const DeviceActivitySpan&) = delete;

 private:
  enum class State { kIdle, kOutermost, kNested };

  void begin(DeviceActivityKind kind, const char* name, c10::DeviceIndex device);
  void finish();

  State state_ = State::kIdle;
  DeviceActivityKind kind_ = DeviceActivityKind::kKernel;
  const char* name_ = nullptr;
  c10::DeviceIndex device_ = 0;
  int64_t stream_ = 0;
  int64_t start_ns_ = 0;
  uint64_t correlation_ = 0;
};

// The name of a copy between host and device memory, as a device timeline shows it.
const char* memcpy_activity_name(bool from_device, bool to_device);

}  // namespace torchneuron
