// The visible logical cores, as the environment describes them:
// NEURON_PLATFORM_TARGET_OVERRIDE, NEURON_LOGICAL_NC_CONFIG, TORCHNEURON_CHIPS and
// NEURON_RT_VISIBLE_CORES.
#pragma once

#include <vector>

#include "neuron_runtime.h"

namespace nrt {

struct Topology {
  const nrt_chip_profile* profile = nullptr;
  int logical_nc_config = 0;   // physical cores per logical core
  int chips = 0;               // chips in the software instance
  int logical_core_count = 0;  // logical cores in the instance, visible or not
  // One entry per visible logical core, renumbered 0..n-1 in ascending logical-core order.
  // capacity_bytes is left equal to hbm_bytes; the runtime caps it by the host budget.
  std::vector<nrt_device_properties> devices;
};

// Reads the environment. On a malformed value returns NRT_INVALID_CONFIG with a message.
nrt_status read_topology(Topology* out);

}  // namespace nrt
