// The device timeline's recorder (device_activity.h): spans of kernels and copies kept while a
// profiler traces, handed to it when the trace stops.
#include "profiler/device_activity.h"

#include <chrono>
#include <mutex>
#include <utility>

#include "device/stream_state.h"

namespace torchneuron {

namespace detail {
std::atomic<bool> g_device_tracing{false};
}  // namespace detail

namespace {

std::mutex g_mutex;
std::vector<DeviceActivity> g_collected;  // guarded by g_mutex
// Bumped by each start, so a thread's correlation stack left over from an earlier profile
// (an op that was running when that profile stopped never pops) is discarded.
std::atomic<uint64_t> g_generation{1};

struct ThreadLaunchState {
  uint64_t generation = 0;
  std::vector<uint64_t> correlations;
  int depth = 0;  // spans open on this thread

  std::vector<uint64_t>& current() {
    const uint64_t now = g_generation.load(std::memory_order_relaxed);
    if (generation != now) {
      generation = now;
      correlations.clear();
    }
    return correlations;
  }
};

thread_local ThreadLaunchState tls_launch;

int64_t unix_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void start_device_tracing() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_collected.clear();
  g_generation.fetch_add(1, std::memory_order_relaxed);
  detail::g_device_tracing.store(true, std::memory_order_relaxed);
}

std::vector<DeviceActivity> stop_device_tracing() {
  std::lock_guard<std::mutex> lock(g_mutex);
  detail::g_device_tracing.store(false, std::memory_order_relaxed);
  return std::exchange(g_collected, {});
}

void push_launch_correlation(uint64_t id) { tls_launch.current().push_back(id); }

uint64_t current_launch_correlation() {
  if (!device_tracing()) return 0;
  const auto& correlations = tls_launch.current();
  return correlations.empty() ? 0 : correlations.back();
}

void pop_launch_correlation() {
  auto& correlations = tls_launch.current();
  if (!correlations.empty()) correlations.pop_back();
}

void DeviceActivitySpan::begin(DeviceActivityKind kind, const char* name, c10::DeviceIndex device) {
  if (tls_launch.depth > 0) {
    ++tls_launch.depth;
    state_ = State::kNested;  // the enclosing span covers this work
    return;
  }
  stream_ = current_stream(device).id();  // may throw: before the span counts as open
  ++tls_launch.depth;
  state_ = State::kOutermost;
  kind_ = kind;
  name_ = name;
  device_ = device;
  const auto& correlations = tls_launch.current();
  correlation_ = correlations.empty() ? 0 : correlations.back();
  start_ns_ = unix_now_ns();
}

void DeviceActivitySpan::finish() {
  const int64_t end_ns = unix_now_ns();
  --tls_launch.depth;
  if (state_ == State::kNested) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!detail::g_device_tracing.load(std::memory_order_relaxed)) return;  // profile stopped
  g_collected.push_back(
      DeviceActivity{kind_, name_, device_, stream_, start_ns_, end_ns, correlation_});
}

const char* memcpy_activity_name(bool from_device, bool to_device) {
  if (from_device && to_device) return "Memcpy DtoD (Neuron -> Neuron)";
  if (from_device) return "Memcpy DtoH (Neuron -> Host)";
  return "Memcpy HtoD (Host -> Neuron)";
}

}  // namespace torchneuron
