// TORCHNEURON_NATIVE_KERNELS, the on/off switch of our own kernels, and their run counts
// (native_kernel_switch.h).
#include "native/native_kernel_switch.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

namespace torchneuron {

bool native_kernels_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("TORCHNEURON_NATIVE_KERNELS");
    if (value == nullptr || *value == '\0' || std::strcmp(value, "1") == 0) return true;
    TORCH_CHECK(std::strcmp(value, "0") == 0, "TORCHNEURON_NATIVE_KERNELS='", value,
                "' is not valid: use 1 (our kernels where they exist, the default) or 0 "
                "(PyTorch's CPU kernels for every op)");
    return false;
  }();
  return enabled;
}

namespace {
struct Counters {
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<std::atomic<uint64_t>>> by_name;
};
Counters& counters() {
  static Counters* instance = new Counters();  // never destroyed: kernels may run at exit
  return *instance;
}
}  // namespace

std::atomic<uint64_t>& native_kernel_counter(const std::string& name) {
  Counters& c = counters();
  std::lock_guard<std::mutex> lock(c.mutex);
  auto& slot = c.by_name[name];
  if (!slot) slot = std::make_unique<std::atomic<uint64_t>>(0);
  return *slot;
}

std::map<std::string, uint64_t> native_kernel_runs() {
  Counters& c = counters();
  std::lock_guard<std::mutex> lock(c.mutex);
  std::map<std::string, uint64_t> result;
  for (const auto& [name, count] : c.by_name) result[name] = count->load();
  return result;
}

}  // namespace torchneuron
