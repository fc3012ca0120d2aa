// torchneuron._C: the functions the Python device module (torch.neuron) is built on.
#include <ATen/Parallel.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/pybind.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "compile/compiled_graph_call.h"
#include "cpu_features.h"
#include "device/device_state.h"
#include "device/generator.h"
#include "device/runtime_status.h"
#include "device/stream_state.h"
#include "distributed/dist_backend.h"
#include "host_kernels/host_kernel_executor.h"
#include "launch/async_launch.h"
#include "memory/caching_allocator.h"
#include "memory/shared_storage.h"
#include "native/native_kernel_switch.h"
#include "op_registrations.h"
#include "ops/op_tracking.h"
#include "task_board.h"

namespace torchneuron {
void register_hooks();
}  // namespace torchneuron

namespace py = pybind11;

namespace {

py::dict device_properties(int64_t index) {
  const int device = torchneuron::checked_device_index(index);
  nrt_device_properties props{};
  NEURON_CHECK(nrt_device_get_properties(device, &props));
  py::dict result;
  result["name"] = std::string(props.name);
  result["chip"] = std::string(props.chip->name);
  result["logical_nc_config"] = props.logical_nc_config;
  result["physical_core_first"] = props.physical_core_first;
  result["chip_index"] = props.chip_index;
  result["hbm_bytes"] = props.hbm_bytes;
  result["total_memory"] = props.capacity_bytes;
  result["hbm_bandwidth_bytes_per_s"] = props.hbm_bandwidth_bytes_per_s;
  result["peak_bf16_flops"] = props.peak_bf16_flops;
  result["peak_fp32_flops"] = props.peak_fp32_flops;
  return result;
}

py::list chip_profiles() {
  py::list result;
  for (int i = 0; i < nrt_chip_profile_count(); ++i) {
    const nrt_chip_profile* p = nrt_chip_profile_at(i);
    py::dict d;
    d["name"] = std::string(p->name);
    d["physical_cores_per_chip"] = p->physical_cores_per_chip;
    d["default_logical_nc_config"] = p->default_logical_nc_config;
    d["max_logical_nc_config"] = p->max_logical_nc_config;
    d["hbm_bytes_per_chip"] = p->hbm_bytes_per_chip;
    d["hbm_bandwidth_bytes_per_s"] = p->hbm_bandwidth_bytes_per_s;
    d["peak_bf16_flops_per_chip"] = p->peak_bf16_flops_per_chip;
    d["peak_fp32_flops_per_chip"] = p->peak_fp32_flops_per_chip;
    d["sbuf_bytes_per_core"] = p->sbuf_bytes_per_core;
    result.append(d);
  }
  return result;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "torchneuron native extension";
  torchneuron::register_hooks();
  torchneuron::register_direct_host_kernels();
  torchneuron::register_nested_host_kernels();
  torchneuron::register_compiled_graph_call(m);
  torchneuron::register_dist_backend(m);
  torchneuron::register_shared_storage(m);

  m.def("_init", [] { NEURON_CHECK(nrt_init()); });
  m.def("_is_initialized", [] { return nrt_is_initialized() != 0; });
  m.def("_in_bad_fork", [] { return nrt_in_bad_fork() != 0; });
  m.def("_device_count", [] { return static_cast<int>(torchneuron::device_count()); });
  m.def("_current_device", [] { return static_cast<int>(torchneuron::current_device()); });
  m.def("_set_device",
        [](int64_t device) { torchneuron::set_device(torchneuron::checked_device_index(device)); });
  m.def("_checked_device_index", [](int64_t device) {
    return static_cast<int>(torchneuron::checked_device_index(device, /*allow_current=*/true));
  });
  m.def("_exchange_device", [](int64_t device) {
    const auto previous = torchneuron::current_device();
    if (device != -1) torchneuron::set_device(torchneuron::checked_device_index(device));
    return static_cast<int>(previous);
  });
  m.def("_get_device_properties", &device_properties);
  m.def("_chip_profiles", &chip_profiles);
  m.def("_synchronize", [](int64_t device) {
    const auto index = torchneuron::checked_device_index(device, /*allow_current=*/true);
    {
      py::gil_scoped_release no_gil;
      NEURON_CHECK(nrt_device_synchronize(index));
    }
    torchneuron::raise_launch_error();
  });
  // Before Python code or Inductor's C++ kernels read device memory themselves (NKI
  // kernels, inductor_device.py): launched work completes. It releases the GIL only when
  // there is work to wait for, so the common case is one atomic load.
  m.def("_wait_for_device_work", [] { torchneuron::wait_for_device_work(); });
  // Keeps the current stream of `device` busy for `ms` milliseconds (torch.cuda._sleep's
  // counterpart): work launched after it is still queued when the next statement runs,
  // whatever the host's speed, which tests of launch ordering rely on.
  m.def("_sleep_on_stream", [](int64_t device, double ms) {
    const auto index = torchneuron::checked_device_index(device, /*allow_current=*/true);
    const auto stream = static_cast<int>(torchneuron::current_stream(index).id());
    auto* duration = new std::chrono::duration<double, std::milli>(ms);
    const nrt_status status = nrt_stream_launch(
        index, stream,
        [](void* arg) {
          const std::unique_ptr<std::chrono::duration<double, std::milli>> owned(
              static_cast<std::chrono::duration<double, std::milli>*>(arg));
          std::this_thread::sleep_for(*owned);
        },
        duration);
    if (status != NRT_SUCCESS) delete duration;  // not launched: not run, not freed there
    NEURON_CHECK(status);
  });
  m.def("_kernel_isa", [] {
    // The host CPU, the instruction set our kernels (csrc/kernels) run with, and the best
    // one the host has (they differ under TORCHNEURON_KERNEL_ISA).
    const auto& features = neuron::kernels::cpu_features();
    return std::map<std::string, std::string>{
        {"model", features.model},
        {"isa", neuron::kernels::isa_name(neuron::kernels::isa_level())},
        {"host_isa", neuron::kernels::isa_name(neuron::kernels::host_isa_level())}};
  });
  m.def("_native_kernels_enabled", &torchneuron::native_kernels_enabled);
  m.def("_native_kernel_runs", [] {
    torchneuron::wait_for_device_work();  // count launched work too
    return torchneuron::native_kernel_runs();
  });
  // The mode this process launches in (NEURON_LAUNCH_BLOCKING, read once).
  m.def("_launch_blocking", [] { return !torchneuron::async_launches(); });
  m.def("_intra_op_threads_used", [] {
    // How many intra-op threads an at::parallel_for compiled into this library runs on: the
    // native kernels' thread split. 1 whatever torch.set_num_threads says if the build lost
    // OpenMP (at::parallel_for is an inline `#pragma omp` template).
    std::mutex mutex;
    std::set<int> threads;
    at::parallel_for(0, 4 * at::get_num_threads(), 1, [&](int64_t, int64_t) {
      const std::lock_guard<std::mutex> lock(mutex);
      threads.insert(at::get_thread_num());
    });
    return static_cast<int64_t>(threads.size());
  });
  // Whether threads waiting for the device run tasks of the worker's kernel (task_board.h),
  // and how many they ran.
  m.def("_waiters_help", [] { return nrt::TaskBoard::instance().enabled(); });
  m.def("_set_waiters_help", [](bool enabled) {
    py::gil_scoped_release no_gil;
    torchneuron::wait_for_device_work();  // kernels already running keep their split
    nrt::TaskBoard::instance().set_enabled(enabled);
  });
  m.def("_helped_tasks", [] { return nrt::TaskBoard::instance().helped_tasks(); });
  // PyTorch's CPU kernels of device ops run with this many threads (host_kernel_executor.h)
  m.def("_host_kernel_threads", [] { return torchneuron::host_kernel_threads(); });
  m.def("_mem_get_info", [](int64_t device) {
    return torchneuron::caching_allocator().getMemoryInfo(
        torchneuron::checked_device_index(device, /*allow_current=*/true));
  });
  m.def("_host_budget", [] {
    uint64_t used = 0, budget = 0;
    nrt_host_budget(&used, &budget);
    return std::make_pair(used, budget);
  });
  m.def("_empty_cache", [] { torchneuron::caching_allocator().emptyCache(); });
  m.def("_default_generator", [](int64_t device) {
    const at::Generator& generator =
        torchneuron::default_generator(torchneuron::checked_device_index(device));
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(generator));
  });
  m.def("_event_elapsed_ms", [](uintptr_t start, uintptr_t end) {
    double ms = 0.0;
    NEURON_CHECK(nrt_event_elapsed_ms(reinterpret_cast<nrt_event_t>(start),
                                      reinterpret_cast<nrt_event_t>(end), &ms));
    return ms;
  });
  // Counts include launched work, so they wait for it.
  m.def("_executed_ops", [] {
    torchneuron::wait_for_device_work();
    return torchneuron::executed_ops();
  });
  m.def("_fallback_ops", [] {
    torchneuron::wait_for_device_work();
    return torchneuron::fallback_ops();
  });
  m.def("_synchronizing_ops", [] {
    torchneuron::wait_for_device_work();
    return torchneuron::synchronizing_ops();
  });
  m.def("_clear_op_tracking", [] {
    torchneuron::wait_for_device_work();
    torchneuron::clear_op_tracking();
  });
}
