// scaled_dot_product_attention backend choice. PyTorch asks each backend which fused
// attention kernel suits the inputs; without an answer a PrivateUse1 device gets the math
// path (separate bmm, softmax, masking ops). Answering as the CPU does lets attention use
// the CPU's flash kernel (run over device memory by the executor), with CPU numerics.
//
// SDPA's flash branch calls aten::_scaled_dot_product_flash_attention_for_cpu on every device
// but CUDA, and that op has no DTensor sharding strategy nor a context-parallel handler.
// For tensor subclasses (DTensor: tensor and context parallel) the flash choice becomes
// efficient attention, whose branch is device-generic: aten::_scaled_dot_product_efficient_
// attention, which neuron implements over the same CPU flash kernel (fused_attention.cpp)
// and which DTensor and context parallel handle as on CUDA. Plain tensors keep the CPU's
// op, which compiled graphs retarget to the native decode kernel (native_attention.py),
// unless the user allows efficient attention and not flash (sdpa_kernel), as CUDA would;
// compiled graphs then run it as torchneuron::efficient_attention (device_only_ops.py).
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/SDPBackend.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice_native.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>

namespace torchneuron {
namespace {

// A tensor subclass that dispatches to Python (DTensor). Fake tensors are Python-dispatched
// too; the caller excludes fake tracing, where a compiled graph keeps the CPU's op (above).
bool is_subclass(const at::Tensor& t) { return t.unsafeGetTensorImpl()->is_python_dispatch(); }

// The CPU's own choice function, called on the neuron tensors themselves. It reads only
// metadata (dtype, nesting, strides, symbolic sizes through sym_size), so it also works on
// fake tensors under torch.compile, and a symbolic sequence length stays symbolic: one
// dynamic graph serves every length, as on the CPU. Concrete sizes (sizes()) would
// specialise the graph to the traced length.
int64_t fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                         const std::optional<at::Tensor>& attn_mask, double dropout_p,
                         bool is_causal, std::optional<double> scale, bool enable_gqa) {
  const auto efficient = static_cast<int64_t>(at::SDPBackend::efficient_attention);
  const at::Context& context = at::globalContext();
  // Efficient attention takes what these take: 4-d inputs with as many key/value heads as
  // query heads, and only where the user allows it (sdpa_kernel).
  const bool efficient_fits = context.userEnabledMemEfficientSDP() && query.dim() == 4 &&
                              key.dim() == 4 && query.sym_size(1) == key.sym_size(1);
  // sdpa_kernel(EFFICIENT_ATTENTION): the CPU has no such kernel and would find no backend.
  // Under fake tracing too: compiled graphs run it as torchneuron::efficient_attention.
  if (efficient_fits && !context.userEnabledFlashSDP()) return efficient;
  const int64_t choice = at::native::_fused_sdp_choice_cpp(query, key, value, attn_mask, dropout_p,
                                                           is_causal, scale, enable_gqa);
  const bool fake =
      c10::impl::TorchDispatchModeTLS::get_mode(c10::impl::TorchDispatchModeKey::FAKE).has_value();
  if (choice == static_cast<int64_t>(at::SDPBackend::flash_attention) && efficient_fits && !fake &&
      is_subclass(query)) {
    return efficient;
  }
  return choice;
}

}  // namespace
}  // namespace torchneuron

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torchneuron::fused_sdp_choice)
}  // namespace at::native
