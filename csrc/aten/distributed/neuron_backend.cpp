// The c10d backend "neuron": its construction (the shared-memory group, or Gloo only),
// the per-call timeout, and _dist_create_backend, through which torchneuron/distributed
// registers it with torch.distributed.
#include "distributed/neuron_backend.h"

#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include "distributed/dist_backend.h"

namespace torchneuron {

namespace py = pybind11;

// `inner` (Gloo) carries point-to-point traffic, and every collective when `use_shm` is
// false (ranks on several hosts, or TORCHNEURON_DIST_TRANSPORT=gloo). `remote_peers` names
// the ranks on other hosts ("ranks 2, 3 on host b"; empty on one host) for Gloo's errors.
NeuronBackend::NeuronBackend(const std::string& name, int rank, int size,
                             std::chrono::milliseconds timeout,
                             c10::intrusive_ptr<c10d::Backend> inner, bool use_shm,
                             std::string remote_peers)
    : c10d::Backend(rank, size),
      timeout_(timeout),
      inner_(std::move(inner)),
      remote_peers_(std::move(remote_peers)) {
  if (use_shm) {
    nrt::dist::GroupOptions options;
    options.name = name;
    options.rank = rank;
    options.size = size;
    options.timeout = timeout;
    try {
      group_ = std::make_unique<nrt::dist::ShmGroup>(options);
    } catch (const std::exception& e) {
      C10_THROW_ERROR(DistBackendError, std::string("neuron backend: ") + e.what());
    }
  }
  init();
}

void NeuronBackend::apply_call_timeout(std::chrono::milliseconds timeout) {
  call_timeout_ = timeout;
  if (group_) group_->set_call_timeout(timeout);
}

void register_dist_backend(py::module_& m) {
  m.def(
      "_dist_create_backend",
      [](const std::string& name, int rank, int size, std::chrono::milliseconds timeout,
         c10::intrusive_ptr<c10d::Backend> inner, bool use_shm,
         std::string remote_peers) -> c10::intrusive_ptr<c10d::Backend> {
        return c10::make_intrusive<NeuronBackend>(name, rank, size, timeout, std::move(inner),
                                                  use_shm, std::move(remote_peers));
      },
      py::arg("name"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("inner"),
      py::arg("use_shm"), py::arg("remote_peers") = std::string(),
      py::call_guard<py::gil_scoped_release>());
}

}  // namespace torchneuron
