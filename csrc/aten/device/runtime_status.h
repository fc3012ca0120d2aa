// Translates runtime status codes into PyTorch errors with the runtime's own message.
#pragma once

#include <c10/util/Exception.h>

#include "neuron_runtime.h"

namespace torchneuron {

[[noreturn]] void throw_runtime_error(nrt_status status, const char* call);

inline void check_runtime(nrt_status status, const char* call) {
  if (C10_UNLIKELY(status != NRT_SUCCESS)) {
    throw_runtime_error(status, call);
  }
}

}  // namespace torchneuron

#define NEURON_CHECK(expr) ::torchneuron::check_runtime((expr), #expr)
