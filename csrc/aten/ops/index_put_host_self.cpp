// aten::_index_put_impl_ (what `x[indices] = v` and index_put_ run) when the indexed tensor
// is on the CPU and the indices are on neuron. The dispatcher picks neuron's kernel because
// one argument is a neuron tensor, as it picks CUDA's for CUDA indices; ATen's kernel then
// moves the indices to the indexed tensor's device (AdvancedIndex in
// ATen/native/TensorAdvancedIndexing.cpp) and a 0-dim value with them, and writes on the
// CPU; values of more dimensions on another device are refused, as CUDA's iterator does. Without
// this kernel the host-kernel executor would refuse the mixed placement. Every other placement runs
// the host-kernel executor as before. (Reading x[indices] with indices on another device is refused
// on CUDA too, and here.)
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <optional>

#include "device/device_placement.h"
#include "host_kernels/host_kernel_executor.h"
#include "op_registrations.h"

namespace torchneuron {
namespace {

void index_put_impl(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  // Schema: (self, indices, values, accumulate, unsafe), self first.
  const auto arguments = stack->end() - 5;
  const at::Tensor self = arguments[0].toTensor();
  if (is_device_tensor(self)) {
    run_on_host_kernels_boxed(op, stack);
    return;
  }
  c10::List<std::optional<at::Tensor>> indices = arguments[1].toOptionalTensorList();
  for (size_t i = 0; i < indices.size(); ++i) {
    const std::optional<at::Tensor> index = indices.get(i);
    if (index.has_value() && is_device_tensor(*index)) indices.set(i, index->to(self.device()));
  }
  at::Tensor values = arguments[2].toTensor();
  if (is_device_tensor(values)) {
    TORCH_CHECK(values.dim() == 0,
                "Expected all tensors to be on the same device, but found at least two devices, "
                "cpu and ",
                values.device(),
                "! (argument 'values' of aten::_index_put_impl_). Move the values to the CPU "
                "tensor's device with .cpu(), or the indexed tensor to the device.");
    values = values.to(self.device());
  }
  at::Tensor result = at::_index_put_impl_(const_cast<at::Tensor&>(self), indices, values,
                                           arguments[3].toBool(), arguments[4].toBool());
  torch::jit::drop(*stack, 5);
  torch::jit::push(*stack, std::move(result));
}

}  // namespace

void register_index_put_host_self(torch::Library& m) {
  m.impl("_index_put_impl_", torch::CppFunction::makeFromBoxedFunction<&index_put_impl>());
}

}  // namespace torchneuron
