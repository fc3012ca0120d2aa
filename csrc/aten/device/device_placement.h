// Which neuron device an op runs on, from its arguments, and the errors for arguments on
// the wrong device. Shared by the boxed host-kernel executor and the typed kernels, so both
// accept and refuse the same placements with the same messages.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <string>

#include "device/device_state.h"

namespace torchneuron {

inline bool is_device_tensor(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1;
}

class DevicePlacement {
 public:
  explicit DevicePlacement(const char* op) : op_(op) {}

  // `arg` names the argument in messages (null: unnamed); `host_allowed` is for arguments
  // the op itself reads on the host (CPU scalars always are, as on CUDA).
  void visit(const at::Tensor& t, const char* arg = nullptr, bool host_allowed = false) {
    if (!t.defined()) return;
    if (t.device().type() == c10::DeviceType::PrivateUse1) {
      const auto index = t.device().index();
      if (device_ < 0) {
        device_ = index;
        return;
      }
      TORCH_CHECK(index == device_,
                  "Expected all tensors to be on the same device, but found at least two "
                  "devices, neuron:",
                  static_cast<int>(device_), " and neuron:", static_cast<int>(index), "! (",
                  where(arg), "). Move them to one device with .to('neuron:N').");
    } else if (t.device().is_cpu()) {
      if (t.dim() != 0 && !host_allowed && host_arg_ == nullptr) host_arg_ = arg ? arg : "";
    } else {
      TORCH_CHECK(false, "Expected all tensors to be on the same device, but found a tensor on ",
                  t.device(), " in ", where(arg), ". Move it with .to('neuron').");
    }
  }

  // A device argument (factories: device='neuron') decides when no tensor did.
  void visit_device(const c10::Device& device) {
    if (device.type() == c10::DeviceType::PrivateUse1 && device_ < 0) {
      device_ = device.has_index() ? device.index() : current_device();
    }
  }

  // Whether a neuron tensor or device argument was seen.
  bool found() const { return device_ >= 0; }

  c10::DeviceIndex device() const {
    TORCH_CHECK(device_ >= 0, op_,
                " was dispatched to the neuron backend but has no neuron tensor or device "
                "argument. Move its tensors to the device with .to('neuron').");
    TORCH_CHECK(host_arg_ == nullptr,
                "Expected all tensors to be on the same device, but found at least two devices, "
                "neuron:",
                static_cast<int>(device_), " and cpu! (", where(host_arg_),
                "). Move the CPU tensor to the device with .to('neuron'), or the neuron "
                "tensors to the host with .cpu().");
    return device_;
  }

 private:
  std::string where(const char* arg) const {
    if (arg == nullptr || *arg == '\0') return op_;
    return std::string("argument '") + arg + "' of " + op_;
  }

  const char* op_;
  c10::DeviceIndex device_ = -1;
  const char* host_arg_ = nullptr;
};

}  // namespace torchneuron
