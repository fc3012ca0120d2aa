// Per-thread error state of the runtime: every failing call leaves a message here.
#pragma once

#include <string>

#include "neuron_runtime.h"

namespace nrt {

// Records `message` as this thread's last error and returns `status`, so call sites can
// write `return fail(NRT_INVALID_ARGUMENT, "...")`.
nrt_status fail(nrt_status status, std::string message);

}  // namespace nrt
