// A compiled graph is host code: Inductor's C++ kernels and its Python wrapper, which read
// and write raw pointers and allocate through the CPU allocator. Device memory is
// host-addressable, so the graph runs on CPU aliases of the neuron inputs, with every
// allocation it makes redirected into device memory, and the results it returns become
// neuron tensors without a copy: the same contract as one eager host kernel
// (host_kernel_executor.cpp), for a whole graph.
#include "compile/compiled_graph_call.h"

#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <vector>

#include "device/runtime_status.h"
#include "device/stream_state.h"
#include "host_kernels/host_kernel_executor.h"
#include "launch/async_launch.h"
#include "native/aten_parallel.h"
#include "neuron_runtime.h"
#include "task_board.h"

namespace py = pybind11;

namespace torchneuron {
namespace {

bool holds_device_tensor(const py::handle& item) {
  if (!THPVariable_Check(item.ptr())) return false;
  const at::Tensor& t = THPVariable_Unpack(item.ptr());
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1;
}

// The graph's products and row kernels are shared with an idle stream worker
// (task_board.h), which exists only once something was launched. A program whose eager ops
// are all too small to launch (compiled decode with a small prompt, say) would run every
// graph on one core: start the current stream's worker with an empty task.
void start_a_worker_to_help(c10::DeviceIndex device) {
  const nrt::TaskBoard& board = nrt::TaskBoard::instance();
  if (!async_launches() || !board.enabled() || board.has_workers()) return;
  const auto stream = static_cast<int>(current_stream(device).id());
  NEURON_CHECK(nrt_stream_launch(device, stream, [](void*) {}, nullptr));
}

// fn(host_args) -> sequence of outputs, run with `threads` OpenMP threads on this thread. Arguments
// that are neuron tensors reach fn as CPU aliases; the outputs flagged in device_outputs come back
// as neuron tensors on `device` (views of an argument stay views of it); the others are returned as
// fn gave them.
py::list call_host_graph(const py::function& fn, const py::list& args, int device,
                         const std::vector<bool>& device_outputs, int threads) {
  const auto index = static_cast<c10::DeviceIndex>(device);
  const c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, index));
  start_a_worker_to_help(index);
  HostKernelCall call(index, nullptr);
  py::list host_args(args.size());
  for (size_t i = 0; i < args.size(); ++i) {
    py::handle item = args[i];
    if (holds_device_tensor(item)) {
      const at::Tensor& t = THPVariable_Unpack(item.ptr());
      TORCH_CHECK(t.device().index() == index, "compiled neuron graph for neuron:", device,
                  " got an input on ", t.device(),
                  "; a compiled graph runs on one device: move its inputs there with .to()");
      host_args[i] = py::cast(call.alias(t));
    } else {
      host_args[i] = item;
    }
  }
  py::object result = call.run("compiled_graph", [&] {
    // the graph's Inductor kernels name this count themselves; the PyTorch kernels it
    // calls read the thread's
    const OpenMpThreads graph_threads(threads);
    return fn(host_args);
  });
  host_args = py::list();  // drop the aliases' Python references before adopting
  py::list outputs;
  std::vector<at::Tensor> hosts;
  {
    py::list items(result);
    result = py::none();
    hosts.reserve(items.size());
    for (size_t i = 0; i < items.size(); ++i) {
      const bool adopt =
          i < device_outputs.size() && device_outputs[i] && THPVariable_Check(items[i].ptr());
      hosts.push_back(adopt ? THPVariable_Unpack(items[i].ptr()) : at::Tensor());
      outputs.append(adopt ? py::object(py::none()) : py::object(items[i]));
    }
  }  // the Python list and its tensor objects are gone: fresh outputs convert in place
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (hosts[i].defined()) outputs[i] = py::cast(call.adopt(std::move(hosts[i])));
  }
  return outputs;
}

}  // namespace

void register_compiled_graph_call(py::module_& m) {
  // The device's core budget for a large graph (backend.py's _graph_threads).
  m.def("_compiled_graph_threads", [] { return compiled_graph_threads(at::get_num_threads()); });
  // ... and for a small one (a decode step): the worker's count, fixed by the host as above
  m.def("_small_compiled_graph_threads",
        [] { return worker_intra_op_threads(at::get_num_threads()); });
  m.def("_call_host_graph", &call_host_graph, py::arg("fn"), py::arg("args"), py::arg("device"),
        py::arg("device_outputs"), py::arg("threads"));
}

}  // namespace torchneuron
