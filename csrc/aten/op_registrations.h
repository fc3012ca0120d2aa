// The index of op registrations: every dispatcher registration of the extension is made in
// op_registrations.cpp, by calling the functions declared here. Each is defined in the file
// of its concept, next to the kernels it registers; the index says which library and
// dispatch key they are registered under, so a reader finds in one place what serves an op.
#pragma once

#include <torch/library.h>

namespace torchneuron {

// ---- torchneuron:: op schemas (the ops our compile backend puts into graphs) ----------------
void define_attention_backward_widened_ops(torch::Library& m);  // attention/
void define_native_attention_decode_ops(torch::Library& m);     // native/
void define_gated_mlp_ops(torch::Library& m);                   // native/
void define_native_gemm_ops(torch::Library& m);                 // native/
void define_varlen_attention_ops(torch::Library& m);            // attention/
void define_fused_attention_ops(torch::Library& m);             // attention/

// ---- their kernels: CPU (the reference), PrivateUse1 and Meta -----------------------------
void register_attention_backward_widened_cpu(torch::Library& m);
void register_native_attention_decode_cpu(torch::Library& m);
void register_gated_mlp_ops_cpu(torch::Library& m);
void register_native_gemm_ops_cpu(torch::Library& m);
void register_varlen_attention_cpu(torch::Library& m);
void register_fused_attention_cpu(torch::Library& m);
void register_gated_mlp_ops_neuron(torch::Library& m);
void register_native_gemm_ops_neuron(torch::Library& m);
void register_gated_mlp_ops_meta(torch::Library& m);

// ---- aten:: ops on PrivateUse1 --------------------------------------------------------------
void register_attention_backward_widened(torch::Library& m);  // attention/
void register_convolution(torch::Library& m);                 // ops/
void register_fused_attention(torch::Library& m);             // attention/
void register_host_iterator_kernels(torch::Library& m);       // host_kernels/
void register_typed_host_kernels(torch::Library& m);          // host_kernels/
void register_native_attention_decode(torch::Library& m);     // native/
void register_native_gather_ops(torch::Library& m);           // native/
void register_native_gemm(torch::Library& m);                 // native/
void register_native_isin(torch::Library& m);                 // native/
void register_device_tensor_ops(torch::Library& m);           // ops/
void register_index_put_host_self(torch::Library& m);         // ops/
void register_native_row_ops(torch::Library& m);              // native/
void register_varlen_attention(torch::Library& m);            // attention/
// Also under AutogradPrivateUse1 (the CPU's algorithm records its own graph).
void register_recurrent_cells(torch::Library& m);   // ops/
void register_recurrent_layers(torch::Library& m);  // ops/

// ---- aten:: ops under other keys ------------------------------------------------------------
void register_autocast_policy(torch::Library& m);    // device/, AutocastPrivateUse1
void register_copy_fallthroughs(torch::Library& m);  // ops/, Conjugate and Negative

// ---- fallbacks (every op without a kernel of its own) ---------------------------------------
void register_host_kernel_fallback(torch::Library& m);    // host_kernels/, PrivateUse1
void register_autocast_fallthrough(torch::Library& m);    // device/, AutocastPrivateUse1
void register_nested_tensor_fallback(torch::Library& m);  // ops/, NestedTensorPrivateUse1

// ---- registrations made when the extension is imported, over all aten ops ------------------
// They select ops by the kernels other libraries registered, so they run after static
// initialisation: once, from the module's init (python_bindings.cpp).
void register_direct_host_kernels();  // host_kernels/host_kernel_executor.cpp
void register_nested_host_kernels();  // ops/nested_tensor_kernels.cpp

}  // namespace torchneuron
