// Lifetime of the runtime: lazy, once-only initialisation, the testing reset, device
// enumeration and fork safety. After initialisation the state is read without locks, so
// nrt_reset_for_testing must not run concurrently with any other call.
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

#include "bytes.h"
#include "error.h"
#include "host_budget.h"
#include "runtime_state.h"
#include "topology.h"

namespace nrt {
namespace {

struct State {
  std::vector<std::unique_ptr<Device>> devices;
};

std::mutex g_init_mutex;  // serialises init and reset; held across fork()
std::atomic<State*> g_state{nullptr};
nrt_status g_init_status = NRT_SUCCESS;  // a sticky init error, guarded by g_init_mutex
std::string g_init_message;              // guarded by g_init_mutex
std::atomic<bool> g_bad_fork{false};

const char kForkedChildMessage[] =
    "the Neuron runtime was initialised in the parent process before fork(); a forked child "
    "cannot use it. Use the 'spawn' start method: multiprocessing.set_start_method('spawn') "
    "(or torch.multiprocessing)";

// Holding the init mutex across fork() means the child never inherits it locked, and an
// initialisation in progress on another thread is either finished or not begun.
void before_fork() { g_init_mutex.lock(); }
void after_fork_in_parent() { g_init_mutex.unlock(); }
void after_fork_in_child() {
  if (g_state.load() != nullptr) g_bad_fork.store(true);
  g_init_mutex.unlock();
}

const int g_atfork_registered =
    pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child);

nrt_status initialize_locked() {
  Topology topology;
  if (nrt_status status = read_topology(&topology)) return status;
  if (nrt_status status = host_budget_configure()) return status;
  auto state = std::make_unique<State>();
  const uint64_t budget = host_budget_bytes();
  for (size_t i = 0; i < topology.devices.size(); ++i) {
    nrt_device_properties props = topology.devices[i];
    props.capacity_bytes = std::min(props.hbm_bytes, budget);
    state->devices.push_back(std::make_unique<Device>(static_cast<int>(i), props));
  }
  g_state.store(state.release());
  return NRT_SUCCESS;
}

}  // namespace

Device::Device(int device_index, const nrt_device_properties& props)
    : index(device_index),
      label(device_label(device_index)),
      properties(props),
      arena(label, props.capacity_bytes) {}

std::string device_label(int device) { return "neuron:" + std::to_string(device); }

nrt_status check_not_forked() {
  (void)g_atfork_registered;
  if (g_bad_fork.load()) return fail(NRT_FORKED_CHILD, kForkedChildMessage);
  return NRT_SUCCESS;
}

nrt_status ensure_initialized() {
  if (nrt_status status = check_not_forked()) return status;
  if (g_state.load() != nullptr) return NRT_SUCCESS;
  std::lock_guard<std::mutex> lock(g_init_mutex);
  if (g_state.load() != nullptr) return NRT_SUCCESS;
  if (g_init_status != NRT_SUCCESS) return fail(g_init_status, g_init_message);
  nrt_status status = initialize_locked();
  if (status != NRT_SUCCESS) {
    g_init_status = status;
    g_init_message = nrt_last_error();
  }
  return status;
}

nrt_status lookup_device(int device, Device** out) {
  if (nrt_status status = ensure_initialized()) return status;
  const State* state = g_state.load();
  const int count = static_cast<int>(state->devices.size());
  if (device < 0 || device >= count) {
    return fail(NRT_INVALID_DEVICE,
                "invalid device index " + std::to_string(device) + ": " + std::to_string(count) +
                    " neuron device" + (count == 1 ? " is" : "s are") + " visible" +
                    (count > 0 ? " (0-" + std::to_string(count - 1) + ")" : std::string()) +
                    "; see NEURON_RT_VISIBLE_CORES");
  }
  *out = state->devices[static_cast<size_t>(device)].get();
  return NRT_SUCCESS;
}

nrt_status lookup_stream(int device, int stream, std::shared_ptr<Stream>* out) {
  Device* dev = nullptr;
  if (nrt_status status = lookup_device(device, &dev)) return status;
  *out = dev->streams.get(stream);
  if (*out != nullptr) return NRT_SUCCESS;
  return fail(NRT_INVALID_HANDLE,
              dev->label + " has no stream " + std::to_string(stream) + " (it has streams 0-" +
                  std::to_string(dev->streams.size() - 1) + "; create one with nrt_stream_create)");
}

}  // namespace nrt

extern "C" nrt_status nrt_init(void) { return nrt::ensure_initialized(); }

extern "C" int nrt_is_initialized(void) {
  return !nrt::g_bad_fork.load() && nrt::g_state.load() != nullptr ? 1 : 0;
}

extern "C" int nrt_in_bad_fork(void) { return nrt::g_bad_fork.load() ? 1 : 0; }

extern "C" nrt_status nrt_reset_for_testing(void) {
  if (nrt_status status = nrt::check_not_forked()) return status;
  std::lock_guard<std::mutex> lock(nrt::g_init_mutex);
  nrt::State* state = nrt::g_state.load();
  if (state != nullptr) {
    std::string held;
    for (const auto& device : state->devices) {
      if (const uint64_t used = device->arena.used()) {
        held += (held.empty() ? "" : ", ") + device->label + " holds " + nrt::format_bytes(used);
      }
    }
    if (!held.empty()) {
      return nrt::fail(NRT_INVALID_ARGUMENT,
                       "nrt_reset_for_testing: device memory is still "
                       "allocated (" +
                           held + "); free it first");
    }
    for (const auto& device : state->devices) {
      for (const auto& stream : device->streams.all()) stream->synchronize();
    }
    delete state;
    nrt::g_state.store(nullptr);
  }
  nrt::g_init_status = NRT_SUCCESS;
  nrt::g_init_message.clear();
  return NRT_SUCCESS;
}

extern "C" nrt_status nrt_device_count(int* count) {
  if (count == nullptr) return nrt::fail(NRT_INVALID_ARGUMENT, "nrt_device_count: count is NULL");
  if (nrt_status status = nrt::ensure_initialized()) return status;
  *count = static_cast<int>(nrt::g_state.load()->devices.size());
  return NRT_SUCCESS;
}

extern "C" nrt_status nrt_device_get_properties(int device, nrt_device_properties* properties) {
  if (properties == nullptr) {
    return nrt::fail(NRT_INVALID_ARGUMENT, "nrt_device_get_properties: properties is NULL");
  }
  nrt::Device* dev = nullptr;
  if (nrt_status status = nrt::lookup_device(device, &dev)) return status;
  *properties = dev->properties;
  return NRT_SUCCESS;
}
