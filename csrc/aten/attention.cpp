// scaled_dot_product_attention backend choice. PyTorch asks each backend which fused
// attention kernel suits the inputs; without an answer a PrivateUse1 device gets the math
// path (separate bmm, softmax, masking ops). Answering as the CPU does lets attention use
// the CPU's flash kernel (run over device memory by the executor), with CPU numerics.
#include <ATen/ATen.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>

#include "host_alias.h"

namespace torchneuron {
namespace {

int64_t fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                         const std::optional<at::Tensor>& attn_mask, double dropout_p,
                         bool is_causal, std::optional<double> scale, bool enable_gqa) {
  HostAliasSet aliases;
  std::optional<at::Tensor> host_mask;
  if (attn_mask.has_value() && attn_mask->defined()) {
    host_mask = attn_mask->device().is_cpu() ? *attn_mask : aliases.alias(*attn_mask);
  }
  return at::_fused_sdp_choice(aliases.alias(query), aliases.alias(key), aliases.alias(value),
                               host_mask, dropout_p, is_causal, scale, enable_gqa);
}

}  // namespace
}  // namespace torchneuron

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torchneuron::fused_sdp_choice)
}  // namespace at::native
