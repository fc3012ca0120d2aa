#include "native_kernels_switch.h"

#include <cstdlib>
#include <cstring>

namespace torchneuron {

bool native_kernels_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("TORCHNEURON_NATIVE_KERNELS");
    return value == nullptr || std::strcmp(value, "0") != 0;
  }();
  return enabled;
}

}  // namespace torchneuron
