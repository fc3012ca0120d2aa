// Internal helpers around the built-in chip profiles (the table lives in chip_profile.cpp).
#pragma once

#include <string>

#include "neuron_runtime.h"

namespace nrt {

// The NeuronCore generation of a profile's cores, e.g. "NeuronCore-v3" for trn2.
const char* core_generation(const nrt_chip_profile* profile);

// The names of all built-in profiles, comma-separated: "trn1, trn2, trn3".
std::string known_profile_names();

}  // namespace nrt
