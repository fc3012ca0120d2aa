// Running a graph compiled for the host (Inductor's C++ code) over neuron tensors.
#pragma once

#include <pybind11/pybind11.h>

namespace torchneuron {

// Adds `_call_host_graph` to the extension module.
void register_compiled_graph_call(pybind11::module_& m);

}  // namespace torchneuron
