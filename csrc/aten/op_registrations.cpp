// Every TORCH_LIBRARY block of the extension, in one place: which function registers which
// ops under which library and dispatch key (the functions live with their kernels, see
// op_registrations.h). tests/test_source_layout.py keeps the blocks here. Within a block
// the calls keep the order in which the files used to register, which also decides which
// registration wins if two ever name the same op and key.
#include "op_registrations.h"

namespace torchneuron {

TORCH_LIBRARY(torchneuron, m) {
  define_attention_backward_widened_ops(m);
  define_native_attention_decode_ops(m);
  define_gated_mlp_ops(m);
  define_native_gemm_ops(m);
  define_varlen_attention_ops(m);
  define_fused_attention_ops(m);
}

TORCH_LIBRARY_IMPL(torchneuron, CPU, m) {
  register_attention_backward_widened_cpu(m);
  register_native_attention_decode_cpu(m);
  register_gated_mlp_ops_cpu(m);
  register_native_gemm_ops_cpu(m);
  register_varlen_attention_cpu(m);
  register_fused_attention_cpu(m);
}

TORCH_LIBRARY_IMPL(torchneuron, PrivateUse1, m) {
  register_gated_mlp_ops_neuron(m);
  register_native_gemm_ops_neuron(m);
}

TORCH_LIBRARY_IMPL(torchneuron, Meta, m) { register_gated_mlp_ops_meta(m); }

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  register_attention_backward_widened(m);
  register_convolution(m);
  register_fused_attention(m);
  register_host_iterator_kernels(m);
  register_typed_host_kernels(m);
  register_native_attention_decode(m);
  register_native_gather_ops(m);
  register_native_gemm(m);
  register_native_isin(m);
  register_device_tensor_ops(m);
  register_index_put_host_self(m);
  register_native_row_ops(m);
  register_recurrent_cells(m);
  register_recurrent_layers(m);
  register_varlen_attention(m);
}

TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  register_recurrent_cells(m);
  register_recurrent_layers(m);
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) { register_autocast_policy(m); }

// Copies resolve conjugate and negative bits themselves (device_tensor_ops.cpp).
TORCH_LIBRARY_IMPL(aten, Conjugate, m) { register_copy_fallthroughs(m); }
TORCH_LIBRARY_IMPL(aten, Negative, m) { register_copy_fallthroughs(m); }

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { register_host_kernel_fallback(m); }
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { register_autocast_fallthrough(m); }
TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) { register_nested_tensor_fallback(m); }

}  // namespace torchneuron
