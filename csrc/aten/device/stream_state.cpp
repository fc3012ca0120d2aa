// The current neuron stream per thread and device, and c10::Stream over the runtime's streams
// (stream_state.h).
#include "device/stream_state.h"

#include <array>
#include <atomic>
#include <mutex>
#include <vector>

#include "device/device_state.h"
#include "device/runtime_status.h"

namespace torchneuron {
namespace {

constexpr int kPoolSize = 8;
constexpr int kPriorityLevels = 2;  // 0 = normal, 1 = high (negative priority, as on CUDA)

thread_local std::vector<c10::StreamId> tls_current_streams;

struct DevicePool {
  std::once_flag created;
  std::array<std::array<int, kPoolSize>, kPriorityLevels> streams{};
  std::array<std::atomic<unsigned>, kPriorityLevels> next{};
};

DevicePool& pool_for(c10::DeviceIndex device) {
  static std::vector<DevicePool> pools(static_cast<size_t>(device_count()));
  return pools.at(static_cast<size_t>(device));
}

c10::Stream make_stream(c10::DeviceIndex device, c10::StreamId id) {
  return c10::Stream(c10::Stream::UNSAFE, c10::Device(c10::DeviceType::PrivateUse1, device), id);
}

}  // namespace

c10::Stream default_stream(c10::DeviceIndex device) {
  return make_stream(resolve_device_index(device), 0);
}

c10::Stream current_stream(c10::DeviceIndex device) {
  device = resolve_device_index(device);
  const auto slot = static_cast<size_t>(device);
  if (slot >= tls_current_streams.size()) {
    return make_stream(device, 0);
  }
  return make_stream(device, tls_current_streams[slot]);
}

c10::Stream exchange_stream(c10::Stream stream) {
  const auto device = resolve_device_index(stream.device_index());
  const c10::Stream previous = current_stream(device);
  const auto slot = static_cast<size_t>(device);
  if (slot >= tls_current_streams.size()) {
    tls_current_streams.resize(static_cast<size_t>(device_count()), 0);
  }
  tls_current_streams[slot] = stream.id();
  return previous;
}

c10::Stream new_stream(c10::DeviceIndex device, int priority) {
  device = resolve_device_index(device);
  int index = 0;
  NEURON_CHECK(nrt_stream_create(device, priority, &index));
  return make_stream(device, index);
}

c10::Stream pooled_stream(c10::DeviceIndex device, int priority) {
  device = resolve_device_index(device);
  DevicePool& pool = pool_for(device);
  std::call_once(pool.created, [&] {
    for (int level = 0; level < kPriorityLevels; ++level) {
      for (int i = 0; i < kPoolSize; ++i) {
        NEURON_CHECK(nrt_stream_create(device, -level, &pool.streams[level][i]));
      }
    }
  });
  const int level = priority < 0 ? 1 : 0;
  const unsigned pick = pool.next[level].fetch_add(1) % kPoolSize;
  return make_stream(device, pool.streams[level][pick]);
}

}  // namespace torchneuron
