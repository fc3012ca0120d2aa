// The c10d backend "neuron": torch.distributed collectives over the shared-memory group of
// csrc/distributed (ranks on one host). Operations run synchronously on the calling
// thread (device streams are synchronous too) and return completed Work objects.
#pragma once

#include <pybind11/pybind11.h>

namespace torchneuron {

// Adds `_dist_create_backend` to the extension module.
void register_dist_backend(pybind11::module_& m);

}  // namespace torchneuron
