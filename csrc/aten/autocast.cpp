// torch.autocast("neuron"): the same per-op precision policy as PyTorch's CUDA autocast
// (lower precision for matmul/linear/conv/bmm/baddbmm/SDPA, float32 for softmax, norms,
// losses and precision-sensitive reductions, widest type for mixed-input ops), using the op
// lists ATen publishes for backends to reuse.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

// The KERNEL macros name ATen types unqualified, so the registrations live in at::autocast.
namespace at::autocast {
namespace {

#define NEURON_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define NEURON_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define NEURON_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define NEURON_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m){
    AT_FORALL_LOWER_PRECISION_FP(NEURON_LOWER_PRECISION_FP) AT_FORALL_FP32(NEURON_FP32)
        AT_FORALL_FP32_SET_OPT_DTYPE(NEURON_FP32_SET_OPT_DTYPE)
            AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(
                KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
                AT_FORALL_PROMOTE(NEURON_PROMOTE)

    // The LSTM layer kernel neuron shares with the CPU (recurrent_layers.cpp): lower
    // precision, as CPU autocast has it and as CUDA has its own RNN kernel (_cudnn_rnn), so an
    // autocast LSTM computes in the autocast dtype like every other recurrent path.
    NEURON_LOWER_PRECISION_FP(mkldnn_rnn_layer)}

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

}  // namespace
}  // namespace at::autocast
