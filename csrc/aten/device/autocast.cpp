// torch.autocast("neuron"): the same per-op precision policy as PyTorch's CUDA autocast
// (lower precision for matmul/linear/conv/bmm/baddbmm/SDPA, float32 for softmax, norms,
// losses and precision-sensitive reductions, widest type for mixed-input ops, and the ops
// CUDA bans), using the op lists ATen publishes for backends to reuse.
#include <ATen/autocast_mode.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include "op_registrations.h"

// The KERNEL macros name ATen types unqualified, so the registrations live in at::autocast.
namespace at::autocast {
namespace {

#define NEURON_LOWER_PRECISION_FP(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define NEURON_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define NEURON_FP32_SET_OPT_DTYPE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define NEURON_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)

// binary_cross_entropy takes probabilities, whose log is badly conditioned in 16 bits;
// CUDA's autocast refuses it rather than silently losing precision, and so do we (ATen's
// own refusal kernel is file-local, so the message is restated here).
Tensor binary_cross_entropy_refused(const Tensor&, const Tensor&, const std::optional<Tensor>&,
                                    int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to "
              "autocast.\nMany models use a sigmoid layer right before the binary cross entropy "
              "layer.\nIn this case, combine the two layers using "
              "torch.nn.functional.binary_cross_entropy_with_logits\nor torch.nn.BCEWithLogitsLoss."
              "  binary_cross_entropy_with_logits and BCEWithLogits are\nsafe to autocast.");
}

// Every op of the lists ATen publishes for backends, with the policy CUDA gives it.
void register_policy(torch::Library& m) {
  // clang-format off
  AT_FORALL_LOWER_PRECISION_FP(NEURON_LOWER_PRECISION_FP)
  AT_FORALL_FP32(NEURON_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(NEURON_FP32_SET_OPT_DTYPE)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE)
  AT_FORALL_PROMOTE(NEURON_PROMOTE)

  // The LSTM layer kernel neuron shares with the CPU (recurrent_layers.cpp): lower
  // precision, as CPU autocast has it and as CUDA has its own RNN kernel (_cudnn_rnn), so an
  // autocast LSTM computes in the autocast dtype like every other recurrent path.
  NEURON_LOWER_PRECISION_FP(mkldnn_rnn_layer)
  // clang-format on

  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"),
         TORCH_FN(binary_cross_entropy_refused));
}

}  // namespace
}  // namespace at::autocast

namespace torchneuron {

void register_autocast_policy(torch::Library& m) { at::autocast::register_policy(m); }

// Ops without a policy run in their own precision: autocast passes them straight through.
void register_autocast_fallthrough(torch::Library& m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

}  // namespace torchneuron
