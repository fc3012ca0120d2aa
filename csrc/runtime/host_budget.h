// The process-wide host-memory budget shared by all devices (TORCHNEURON_HOST_MEMORY_BUDGET).
#pragma once

#include <cstdint>

#include "neuron_runtime.h"

namespace nrt {

// Reads TORCHNEURON_HOST_MEMORY_BUDGET (default: 75% of physical RAM). Returns
// NRT_INVALID_CONFIG with a message when it is malformed. The used count is kept.
nrt_status host_budget_configure();

uint64_t host_budget_bytes();
uint64_t host_budget_used();

// Atomically takes `bytes` from the budget; false (and nothing taken) if it would overflow.
bool host_budget_try_reserve(uint64_t bytes);
void host_budget_release(uint64_t bytes);

}  // namespace nrt
