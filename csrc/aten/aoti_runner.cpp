// AOTInductor model runner for packages compiled from programs on neuron tensors. The
// package's C++ is a CPU program (torchneuron/inductor_aot.py writes the neuron device as
// the CPU); device memory is host-addressable, so this runner calls it on CPU aliases of
// the neuron inputs with its allocations served from device memory, and the outputs come
// back as neuron tensors without a copy: the contract of compiled_graph_call.cpp, for a
// package loaded by torch._inductor.aoti_load_package (any process that imports torch).
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/inductor/aoti_runner/model_container_runner_cpu.h>
#include <torch/csrc/inductor/aoti_torch/tensor_converter.h>

#include <memory>
#include <string>
#include <vector>

#include "allocation_redirect.h"
#include "host_alias.h"
#include "op_tracking.h"

namespace torchneuron {
namespace {

constexpr const char* kDeviceKey = "neuron";

// "neuron" (the inputs' device) or "neuron:N" (aoti_load_package(..., device_index=N)).
c10::DeviceIndex parse_device_index(const std::string& device_str) {
  const std::string prefix = std::string(kDeviceKey) + ":";
  if (device_str == kDeviceKey) return -1;
  TORCH_CHECK(device_str.rfind(prefix, 0) == 0 && device_str.size() > prefix.size(),
              "AOTInductor neuron runner: unexpected device '", device_str,
              "' (expected 'neuron' or 'neuron:N')");
  int index = -1;
  try {
    index = std::stoi(device_str.substr(prefix.size()));
  } catch (const std::exception&) {
    TORCH_CHECK(false, "AOTInductor neuron runner: bad device index in '", device_str, "'");
  }
  return static_cast<c10::DeviceIndex>(index);
}

class NeuronModelRunner final : public torch::inductor::AOTIModelContainerRunnerCpu {
 public:
  NeuronModelRunner(const std::string& model_so_path, size_t num_models,
                    const std::string& device_str, bool run_single_threaded)
      : AOTIModelContainerRunnerCpu(model_so_path, num_models, run_single_threaded),
        device_index_(parse_device_index(device_str)) {}

 protected:
  std::vector<at::Tensor> run_impl(std::vector<AtenTensorHandle>& input_handles,
                                   void* stream_handle) override {
    // The handles are ours to consume, as they are the model's in the base runner.
    std::vector<at::Tensor> inputs = torch::aot_inductor::alloc_tensors_by_stealing_from_handles(
        input_handles.data(), input_handles.size());
    input_handles.clear();
    const c10::DeviceIndex index = device_for(inputs);
    const c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, index));

    HostAliasSet aliases;
    std::vector<at::Tensor> host_inputs;
    host_inputs.reserve(inputs.size());
    for (size_t i = 0; i < inputs.size(); ++i) {
      const at::Tensor& t = inputs[i];
      if (!t.defined() || t.device().is_cpu()) {
        host_inputs.push_back(t);  // host memory already (a program input exported on CPU)
        continue;
      }
      TORCH_CHECK(t.device() == c10::Device(c10::DeviceType::PrivateUse1, index),
                  "AOTInductor package for neuron:", static_cast<int>(index), " got input ", i,
                  " on ", t.device(), "; move the inputs to that device with .to(), or load ",
                  "the package with device_index=<their device>");
      host_inputs.push_back(aliases.alias(t));
    }
    std::vector<at::Tensor> host_outputs;
    {
      const DeviceAllocationScope scope(index);
      std::vector<AtenTensorHandle> handles =
          torch::aot_inductor::unsafe_alloc_new_handles_from_tensors(host_inputs);
      host_inputs.clear();  // the model owns its inputs now and may free them early
      host_outputs = AOTIModelContainerRunner::run_impl(handles, stream_handle);
    }
    // Counted like an op: get_executed_ops() shows the runs, get_fallback_ops() any output
    // that had to be copied into device memory (one the program did not allocate there).
    static OpCounter& counter = op_counter_named("aoti::model_run");
    counter.executed.fetch_add(1, std::memory_order_relaxed);
    ResultAdopter adopter(aliases, index, &counter);
    std::vector<at::Tensor> outputs;
    outputs.reserve(host_outputs.size());
    for (at::Tensor& host : host_outputs) outputs.push_back(adopter.adopt(std::move(host)));
    return outputs;
  }

 private:
  // The device the package was loaded for, else the neuron inputs' (which must agree),
  // else the current device.
  c10::DeviceIndex device_for(const std::vector<at::Tensor>& inputs) const {
    if (device_index_ >= 0) return device_index_;
    for (const at::Tensor& t : inputs) {
      if (t.defined() && t.device().type() == c10::DeviceType::PrivateUse1) {
        return t.device().index();
      }
    }
    return c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)->getDevice().index();
  }

  c10::DeviceIndex device_index_;
};

std::unique_ptr<torch::inductor::AOTIModelContainerRunner> create_runner(
    const std::string& model_so_path, size_t num_models, const std::string& device_str,
    const std::string& /*bin_dir: device binaries; the CPU program has none*/,
    const bool run_single_threaded) {
  return std::make_unique<NeuronModelRunner>(model_so_path, num_models, device_str,
                                             run_single_threaded);
}

// Registered when the extension loads (at `import torch`, through the backend autoload).
const torch::inductor::RegisterAOTIModelRunner g_register_runner(kDeviceKey, &create_runner);

}  // namespace
}  // namespace torchneuron
