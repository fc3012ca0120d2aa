// The device timeline of torch.profiler (Kineto): a child activity profiler, registered for
// PrivateUse1, that turns the kernels and copies device_activity.h collected during a trace
// into Kineto activities. Each one is linked to the CPU op that launched it, so the trace
// viewer draws it on the neuron device's stream row and key_averages() credits its time to
// that op's device time. Used when the profiler runs with ProfilerActivity.PrivateUse1
// (torch.profiler) or use_device="neuron", use_kineto=True (torch.autograd.profiler).
#include <IActivityProfiler.h>
#include <libkineto.h>
#include <output_base.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "launch/async_launch.h"
#include "profiler/device_activity.h"

namespace torchneuron {
namespace {

using libkineto::ActivityType;

// Linux process ids stay below 2^22, so device rows sorted from here come after the CPU's.
constexpr int64_t kDeviceSortBase = int64_t{1} << 22;

const std::set<ActivityType>& device_activity_types() {
  static const std::set<ActivityType> types = {ActivityType::CONCURRENT_KERNEL,
                                               ActivityType::GPU_MEMCPY};
  return types;
}

class NeuronProfilerSession final : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    start_device_tracing();
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    wait_for_device_work();  // kernels launched inside the profile are part of it
    collected_ = stop_device_tracing();
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override { return {}; }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, nullptr, 0, 0);
  }

  // Logs the activities inside the capture window (all of them if the window is empty);
  // the buffer keeps them alive for the logger, which holds pointers to them.
  void processTrace(libkineto::ActivityLogger& logger,
                    libkineto::getLinkedActivityCallback cpu_activity, int64_t window_start,
                    int64_t window_end) override {
    const bool windowed = window_end > window_start;
    buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
    buffer_->span = libkineto::TraceSpan(window_start, window_end, "neuron");
    buffer_->gpuOpCount = 0;
    for (const DeviceActivity& record : collected_) {
      if (windowed && (record.start_ns < window_start || record.end_ns > window_end)) continue;
      const ActivityType type = record.kind == DeviceActivityKind::kMemcpy
                                    ? ActivityType::GPU_MEMCPY
                                    : ActivityType::CONCURRENT_KERNEL;
      buffer_->emplace_activity(buffer_->span, type, record.name);
      libkineto::GenericTraceActivity& activity = *buffer_->activities.back();
      activity.startTime = record.start_ns;
      activity.endTime = record.end_ns;
      activity.id = static_cast<int32_t>(record.correlation);
      activity.device = record.device;
      activity.resource = static_cast<int32_t>(record.stream);
      activity.addMetadata("device", record.device);
      activity.addMetadata("stream", record.stream);
      activity.addMetadata("correlation", record.correlation);
      if (record.correlation != 0 && cpu_activity) {
        activity.linked = cpu_activity(static_cast<int32_t>(record.correlation));
      }
      streams_.emplace(record.device, record.stream);
      buffer_->gpuOpCount += 1;
      activity.log(logger);
    }
    collected_.clear();
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    // Kineto takes one process row per child session: the lowest device that ran work.
    const int64_t device = streams_.empty() ? 0 : streams_.begin()->first;
    return std::make_unique<libkineto::DeviceInfo>(libkineto::DeviceInfo{
        device, kDeviceSortBase + device, "neuron", "neuron " + std::to_string(device)});
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> infos;
    for (const auto& [device, stream] : streams_) {
      infos.push_back(
          libkineto::ResourceInfo{stream, stream, device, "stream " + std::to_string(stream)});
    }
    return infos;
  }

  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override {
    return std::move(buffer_);
  }

  void pushCorrelationId(uint64_t id) override { push_launch_correlation(id); }
  void popCorrelationId() override { pop_launch_correlation(); }

 private:
  std::vector<DeviceActivity> collected_;
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
  std::set<std::pair<int64_t, int64_t>> streams_;  // (device, stream) pairs that ran work
};

class NeuronActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }

  const std::set<ActivityType>& availableActivities() const override {
    return device_activity_types();
  }

  // No session unless device activities were asked for: a CPU-only profile has no device rows.
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<ActivityType>& activity_types, const libkineto::Config& /*config*/) override {
    const auto& wanted = device_activity_types();
    const bool any = std::any_of(activity_types.begin(), activity_types.end(),
                                 [&](ActivityType type) { return wanted.count(type) > 0; });
    if (!any) return nullptr;
    return std::make_unique<NeuronProfilerSession>();
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      int64_t /*ts_ms*/, int64_t /*duration_ms*/, const std::set<ActivityType>& activity_types,
      const libkineto::Config& config) override {
    return configure(activity_types, config);
  }

 private:
  const std::string name_ = "neuron";
};

REGISTER_PRIVATEUSE1_PROFILER(NeuronActivityProfiler);

}  // namespace
}  // namespace torchneuron
