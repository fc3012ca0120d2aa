// Registrations of the unboxed host kernels (host_kernel_typed.h) for the ops that dominate
// eager workloads (elementwise math, reductions, activations, joins). Which ops: those whose
// per-call overhead shows in small-tensor workloads (generation, optimizer steps).
#include "host_kernels/host_kernel_typed.h"

#include <torch/library.h>

#include <string>

#include "op_registrations.h"

namespace torchneuron {
namespace {

template <class Op>
void register_typed(torch::Library& m) {
  using Kernel = TypedHostKernel<Op>;
  std::string qualified = std::string(Op::name).substr(6);  // drop "aten::"
  if (*Op::overload_name != '\0') qualified += std::string(".") + Op::overload_name;
  m.impl(qualified.c_str(), TORCH_FN(Kernel::run));
}

}  // namespace

void register_typed_host_kernels(torch::Library& m) {
  // Elementwise arithmetic (the floating binary and unary ops: host_iterator_kernels.cpp,
  // which falls back to these kernels for the other cases).
  register_typed<at::_ops::add_Scalar>(m);
  register_typed<at::_ops::mul_Scalar>(m);
  register_typed<at::_ops::mul__Scalar>(m);
  register_typed<at::_ops::div_Scalar>(m);
  register_typed<at::_ops::pow_Tensor_Scalar>(m);
  register_typed<at::_ops::where_self>(m);
  register_typed<at::_ops::fill__Scalar>(m);
  register_typed<at::_ops::masked_fill__Scalar>(m);
  register_typed<at::_ops::addcmul_>(m);
  register_typed<at::_ops::lerp__Scalar>(m);
  // Activations (silu and softmax: native_row_ops.cpp; relu: host_iterator_kernels.cpp).
  register_typed<at::_ops::gelu>(m);
  // Norms: several results each, on every transformer layer's path (attention:
  // native_attention_decode.cpp).
  register_typed<at::_ops::native_layer_norm>(m);
  // Their backward passes, and the activations', for training steps.
  register_typed<at::_ops::native_layer_norm_backward>(m);
  register_typed<at::_ops::gelu_backward>(m);
  register_typed<at::_ops::threshold_backward>(m);
  // Matmul (mm, bmm, addmm) is native_gemm.cpp's.
  // Reductions.
  register_typed<at::_ops::sum>(m);
  register_typed<at::_ops::sum_dim_IntList>(m);
  register_typed<at::_ops::mean_dim>(m);
  register_typed<at::_ops::argmax>(m);
  // Joining and gathering (cat, index_select) is native_gather_ops.cpp's, which falls back
  // to TypedHostKernel.
}

}  // namespace torchneuron
