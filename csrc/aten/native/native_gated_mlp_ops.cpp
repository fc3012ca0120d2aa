// torchneuron::silu_mul(gate, up) = silu(gate) * up, the SiLU-gated MLP's elementwise part,
// and its backward, on our own kernel (csrc/kernels/row_kernels.h). No aten op computes
// the pair, so eager code never reaches it: the neuron compile backend puts it into graphs
// (torchneuron/compile/rewrites.py), whose host code calls it on CPU aliases of device
// memory; hence the CPU and PrivateUse1 kernels are one function. Its autograd formula is
// registered from Python (compile_rewrites.py). Shapes or dtypes the kernel does not take
// compute silu(gate) * up with aten ops, so the op is defined for every input.
#include <ATen/Operators.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/silu_backward.h>
#include <torch/library.h>

#include <atomic>
#include <optional>
#include <tuple>

#include "launch/async_launch.h"
#include "native/aten_parallel.h"
#include "native/native_kernel_switch.h"
#include "op_registrations.h"
#include "profiler/device_activity.h"
#include "row_kernels.h"

namespace torchneuron {
namespace {

namespace nk = neuron::kernels;

std::optional<nk::RowDtype> kernel_dtype(std::initializer_list<const at::Tensor*> tensors) {
  if (!native_kernels_enabled()) return std::nullopt;
  const at::Tensor& first = **tensors.begin();
  std::optional<nk::RowDtype> dtype;
  if (first.scalar_type() == at::kFloat) dtype = nk::RowDtype::kFloat32;
  if (first.scalar_type() == at::kBFloat16) dtype = nk::RowDtype::kBFloat16;
  if (!dtype) return std::nullopt;
  for (const at::Tensor* t : tensors) {
    if (t->device() != first.device() || t->scalar_type() != first.scalar_type() ||
        t->sizes() != first.sizes() || !t->is_contiguous()) {
      return std::nullopt;
    }
  }
  return dtype;
}

at::Tensor silu_mul(const at::Tensor& gate, const at::Tensor& up) {
  static std::atomic<uint64_t>& runs = native_kernel_counter("torchneuron::silu_mul");
  const auto dtype = kernel_dtype({&gate, &up});
  if (!dtype) return at::mul(at::silu(gate), up);
  wait_for_device_work();  // it reads device memory on this thread
  // Inside a compiled graph (CPU aliases) the graph's own span covers the call.
  std::optional<DeviceActivitySpan> span;
  if (!gate.device().is_cpu()) {
    span.emplace(DeviceActivityKind::kKernel, "torchneuron::silu_mul", gate.device().index());
  }
  runs.fetch_add(1, std::memory_order_relaxed);
  at::Tensor out = at::empty(gate.sizes(), gate.options());
  const void* a = gate.const_data_ptr();
  const void* b = up.const_data_ptr();
  void* y = out.mutable_data_ptr();
  const nk::RowKernels& kernels = nk::row_kernels();
  parallel_chunks(gate.numel(), kElementsPerTask, 1, [&](int64_t begin, int64_t end) {
    kernels.silu_mul(*dtype, a, b, y, begin, end);
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> silu_mul_backward(const at::Tensor& grad, const at::Tensor& gate,
                                                     const at::Tensor& up) {
  static std::atomic<uint64_t>& runs = native_kernel_counter("torchneuron::silu_mul_backward");
  const auto dtype = kernel_dtype({&grad, &gate, &up});
  if (!dtype) {
    return {at::silu_backward(at::mul(grad, up), gate), at::mul(grad, at::silu(gate))};
  }
  wait_for_device_work();  // it reads device memory on this thread
  // Inside a compiled graph (CPU aliases) the graph's own span covers the call.
  std::optional<DeviceActivitySpan> span;
  if (!gate.device().is_cpu()) {
    span.emplace(DeviceActivityKind::kKernel, "torchneuron::silu_mul_backward",
                 gate.device().index());
  }
  runs.fetch_add(1, std::memory_order_relaxed);
  at::Tensor grad_gate = at::empty(gate.sizes(), gate.options());
  at::Tensor grad_up = at::empty(up.sizes(), up.options());
  const void* g = grad.const_data_ptr();
  const void* a = gate.const_data_ptr();
  const void* b = up.const_data_ptr();
  void* da = grad_gate.mutable_data_ptr();
  void* db = grad_up.mutable_data_ptr();
  const nk::RowKernels& kernels = nk::row_kernels();
  parallel_chunks(gate.numel(), kElementsPerTask, 1, [&](int64_t begin, int64_t end) {
    kernels.silu_mul_backward(*dtype, g, a, b, da, db, begin, end);
  });
  return {grad_gate, grad_up};
}

// Shapes for fake tensors (torch.compile traces with them).
at::Tensor silu_mul_meta(const at::Tensor& gate, const at::Tensor& up) {
  return at::empty(gate.sizes(), gate.options());
}

std::tuple<at::Tensor, at::Tensor> silu_mul_backward_meta(const at::Tensor& grad,
                                                          const at::Tensor& gate,
                                                          const at::Tensor& up) {
  return {at::empty(gate.sizes(), gate.options()), at::empty(up.sizes(), up.options())};
}

}  // namespace

void define_gated_mlp_ops(torch::Library& m) {
  m.def("silu_mul(Tensor gate, Tensor up) -> Tensor");
  m.def("silu_mul_backward(Tensor grad, Tensor gate, Tensor up) -> (Tensor, Tensor)");
}

void register_gated_mlp_ops_cpu(torch::Library& m) {
  m.impl("silu_mul", TORCH_FN(silu_mul));
  m.impl("silu_mul_backward", TORCH_FN(silu_mul_backward));
}

void register_gated_mlp_ops_neuron(torch::Library& m) {
  m.impl("silu_mul", TORCH_FN(silu_mul));
  m.impl("silu_mul_backward", TORCH_FN(silu_mul_backward));
}

void register_gated_mlp_ops_meta(torch::Library& m) {
  m.impl("silu_mul", TORCH_FN(silu_mul_meta));
  m.impl("silu_mul_backward", TORCH_FN(silu_mul_backward_meta));
}

}  // namespace torchneuron
