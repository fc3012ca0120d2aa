// Nested tensors (the strided nested layout) on neuron: PyTorch's nested-tensor kernels for
// the CPU run over device memory, as the dense host-kernel executor does for dense ops. A
// nested neuron tensor is passed as a CPU nested tensor over a host alias of its buffer,
// allocations go to device memory, and nested results are rebuilt around their adopted
// buffers. Why: nn.TransformerEncoder's inference fast path (eval, no grad, a padding mask)
// turns the batch into a nested tensor on every device it lists, PrivateUse1 included.
#include <ATen/NestedTensorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "device/device_placement.h"
#include "device/device_state.h"
#include "host_kernels/bulk_registration.h"
#include "host_kernels/host_kernel_executor.h"
#include "op_registrations.h"

namespace torchneuron {
namespace {

// A CPU nested tensor with the nested tensor `t`'s geometry over a host alias of its memory.
at::Tensor host_nested(const at::Tensor& t, HostKernelCall& call) {
  const auto* impl = at::native::get_nested_tensor_impl(t);
  at::Tensor memory = call.alias(impl->get_unsafe_storage_as_tensor());
  return at::detail::make_tensor<at::native::NestedTensorImpl>(
      memory, impl->get_nested_sizes(), impl->get_nested_strides(), impl->get_storage_offsets());
}

// A neuron tensor for a host kernel's result: nested results keep their geometry around
// their adopted memory; a nested view of a nested argument (narrow, chunk) is a view of it.
at::Tensor device_result(
    const at::Tensor& host, HostKernelCall& call,
    const std::unordered_map<const c10::StorageImpl*, at::Tensor>& nested_arguments) {
  if (!host.defined() || !host.is_nested()) return call.adopt(host);
  const auto* impl = at::native::get_nested_tensor_impl(host);
  auto base = nested_arguments.find(impl->storage().unsafeGetStorageImpl());
  if (base != nested_arguments.end()) {
    return at::detail::make_tensor<at::native::NestedTensorImpl>(
        c10::TensorImpl::VIEW, base->second, impl->get_nested_sizes(), impl->get_nested_strides(),
        impl->get_storage_offsets());
  }
  at::Tensor memory = call.adopt(impl->get_unsafe_storage_as_tensor());
  return at::detail::make_tensor<at::native::NestedTensorImpl>(
      memory, impl->get_nested_sizes(), impl->get_nested_strides(), impl->get_storage_offsets());
}

// The device a Device argument asks the results on (`nested.to(...)`), if any.
std::optional<c10::Device> requested_device(const torch::jit::Stack& stack, size_t first) {
  for (size_t i = first; i < stack.size(); ++i) {
    if (stack[i].isDevice()) return stack[i].toDevice();
  }
  return std::nullopt;
}

void run_nested_on_host_kernels(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const std::string name = c10::toString(schema.operator_name());
  const size_t num_args = schema.arguments().size();
  const size_t first = stack->size() - num_args;

  // An op with a Device argument copies across devices (PyTorch's BackendSelect sends
  // `cpu_nested.to('neuron')` and `neuron_nested.to('cpu')` here): its tensors may be on the
  // host, and its results go where the argument says.
  const std::optional<c10::Device> requested = requested_device(*stack, first);
  DevicePlacement placement(name.c_str());
  for (size_t i = first; i < stack->size(); ++i) {
    const c10::IValue& value = (*stack)[i];
    const char* arg = schema.arguments()[i - first].name().c_str();
    if (value.isTensor()) {
      placement.visit(value.toTensor(), arg, requested.has_value());
    } else if (value.isTensorList()) {
      for (const at::Tensor& t : value.toTensorList()) {
        placement.visit(t, arg, requested.has_value());
      }
    }
  }
  const bool to_host = requested.has_value() && requested->is_cpu();
  c10::DeviceIndex device = -1;
  if (requested.has_value() && requested->type() == c10::DeviceType::PrivateUse1) {
    device = requested->has_index() ? requested->index() : current_device();
  } else if (!to_host) {
    device = placement.device();
  }

  HostKernelCall call(device, nullptr);
  // A result that is an argument's own host stand-in (in-place ops) is that argument.
  std::unordered_map<const c10::TensorImpl*, c10::IValue> stands_for;
  std::unordered_map<const c10::StorageImpl*, at::Tensor> nested_arguments;  // by host storage
  auto to_host_tensor = [&](const at::Tensor& t) -> at::Tensor {
    if (!is_device_tensor(t)) return t;
    at::Tensor host = t.is_nested() ? host_nested(t, call) : call.alias(t);
    stands_for.emplace(host.unsafeGetTensorImpl(), t);
    if (t.is_nested()) nested_arguments.emplace(host.storage().unsafeGetStorageImpl(), t);
    return host;
  };
  for (size_t i = first; i < stack->size(); ++i) {
    c10::IValue& value = (*stack)[i];
    if (value.isTensor()) {
      value = to_host_tensor(value.toTensor());
    } else if (value.isTensorList()) {
      c10::List<at::Tensor> converted;
      for (const at::Tensor& t : value.toTensorList()) converted.push_back(to_host_tensor(t));
      value = std::move(converted);
    } else if (value.isDevice() && value.toDevice().type() == c10::DeviceType::PrivateUse1) {
      value = c10::IValue(c10::Device(c10::DeviceType::CPU));
    }
  }

  const auto host_keys = c10::DispatchKeySet(c10::DispatchKey::NestedTensorCPU);
  if (to_host) {
    op.redispatchBoxed(host_keys, stack);
    return;
  }
  call.run_without_span([&] { op.redispatchBoxed(host_keys, stack); });

  const size_t returns_first = stack->size() - schema.returns().size();
  for (size_t j = returns_first; j < stack->size(); ++j) {
    c10::IValue& value = (*stack)[j];
    if (value.isTensor()) {
      auto argument = stands_for.find(value.toTensor().unsafeGetTensorImpl());
      value = argument != stands_for.end()
                  ? argument->second
                  : c10::IValue(device_result(value.toTensor(), call, nested_arguments));
    } else if (value.isTensorList()) {
      c10::List<at::Tensor> converted;
      for (const at::Tensor& t : value.toTensorList()) {
        converted.push_back(device_result(t, call, nested_arguments));
      }
      value = std::move(converted);
    }
  }
}

}  // namespace

void register_nested_tensor_fallback(torch::Library& m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&run_nested_on_host_kernels>());
}

void register_nested_host_kernels() {
  // Ops with a nested kernel for the CPU that are also CompositeImplicitAutograd (linear,
  // matmul, narrow, chunk) would reach nested neuron tensors through the decomposition,
  // which does not handle nested tensors; they go to the CPU's nested kernels instead.
  static const std::unique_ptr<torch::Library> library =
      register_for_aten_ops<&run_nested_on_host_kernels>(
          c10::DispatchKey::NestedTensorPrivateUse1, [](const c10::OperatorHandle& op) {
            return op.hasKernelForDispatchKey(c10::DispatchKey::NestedTensorCPU) &&
                   op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
          });
  (void)library;
}

}  // namespace torchneuron
