// Convolutions. PyTorch routes convolution on a backend without its own kernel to the
// `*_overrideable` hooks (they have no CPU kernel, so the generic executor cannot serve
// them); these run PyTorch's CPU convolution over aliases of the device tensors.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "host_kernels/host_kernel_executor.h"
#include "op_registrations.h"
#include "ops/op_tracking.h"

namespace torchneuron {
namespace {

std::optional<at::Tensor> alias_optional(HostKernelCall& call, const std::optional<at::Tensor>& t) {
  if (!t.has_value() || !t->defined()) return std::nullopt;
  return call.alias(*t);
}

at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias, c10::IntArrayRef stride,
                       c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                       c10::IntArrayRef output_padding, int64_t groups) {
  static OpCounter& counter = op_counter_named("aten::convolution_overrideable");
  counter.executed.fetch_add(1, std::memory_order_relaxed);
  HostKernelCall call(input.device().index(), &counter);
  at::Tensor host_input = call.alias(input);
  at::Tensor host_weight = call.alias(weight);
  std::optional<at::Tensor> host_bias = alias_optional(call, bias);
  at::Tensor result = call.run("aten::convolution_overrideable", [&] {
    return at::convolution(host_input, host_weight, host_bias, stride, padding, dilation,
                           transposed, output_padding, groups);
  });
  return call.adopt(std::move(result));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
    c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
    c10::IntArrayRef output_padding, int64_t groups, std::array<bool, 3> output_mask) {
  static OpCounter& counter = op_counter_named("aten::convolution_backward_overrideable");
  counter.executed.fetch_add(1, std::memory_order_relaxed);
  HostKernelCall call(input.device().index(), &counter);
  at::Tensor host_grad = call.alias(grad_output);
  at::Tensor host_input = call.alias(input);
  at::Tensor host_weight = call.alias(weight);
  std::vector<int64_t> bias_sizes;
  if (output_mask[2]) bias_sizes.push_back(grad_output.size(1));
  std::tuple<at::Tensor, at::Tensor, at::Tensor> grads =
      call.run("aten::convolution_backward_overrideable", [&] {
        return at::convolution_backward(
            host_grad, host_input, host_weight,
            output_mask[2] ? at::OptionalIntArrayRef(bias_sizes) : at::OptionalIntArrayRef(),
            stride, padding, dilation, transposed, output_padding, groups, output_mask);
      });
  return {call.adopt(std::move(std::get<0>(grads))), call.adopt(std::move(std::get<1>(grads))),
          call.adopt(std::move(std::get<2>(grads)))};
}

}  // namespace

void register_convolution(torch::Library& m) {
  m.impl("convolution_overrideable", TORCH_FN(convolution));
  m.impl("convolution_backward_overrideable", TORCH_FN(convolution_backward));
}

}  // namespace torchneuron
