// scaled_dot_product_attention backend choice. PyTorch asks each backend which fused
// attention kernel suits the inputs; without an answer a PrivateUse1 device gets the math
// path (separate bmm, softmax, masking ops). Answering as the CPU does lets attention use
// the CPU's flash kernel (run over device memory by the executor), with CPU numerics.
#include <ATen/ATen.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice_native.h>

namespace torchneuron {
namespace {

// The CPU's own choice function, called on the neuron tensors themselves. It reads only
// metadata (dtype, nesting, strides, symbolic sizes through sym_size), so it also works on
// fake tensors under torch.compile, and a symbolic sequence length stays symbolic: one
// dynamic graph serves every length, as on the CPU. Concrete sizes (sizes()) would
// specialise the graph to the traced length.
int64_t fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                         const std::optional<at::Tensor>& attn_mask, double dropout_p,
                         bool is_causal, std::optional<double> scale, bool enable_gqa) {
  return at::native::_fused_sdp_choice_cpp(query, key, value, attn_mask, dropout_p, is_causal,
                                           scale, enable_gqa);
}

}  // namespace
}  // namespace torchneuron

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torchneuron::fused_sdp_choice)
}  // namespace at::native
