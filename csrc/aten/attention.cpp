// scaled_dot_product_attention backend choice. PyTorch asks each backend which fused
// attention kernel suits the inputs; without an answer a PrivateUse1 device gets the math
// path (separate bmm, softmax, masking ops). Answering as the CPU does lets attention use
// the CPU's flash kernel (run over device memory by the executor), with CPU numerics.
#include <ATen/ATen.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

namespace torchneuron {
namespace {

// A CPU tensor with the geometry, dtype and requires_grad of `t`, for the CPU's choice
// logic, which reads metadata only. It must not alias `t`: under torch.compile `t` is a
// fake tensor without memory.
at::Tensor stand_in(const at::Tensor& t) {
  alignas(64) static char no_data[64];
  at::Tensor result =
      at::from_blob(no_data, t.sizes(), t.strides(), at::TensorOptions().dtype(t.scalar_type()));
  if (t.requires_grad()) result.set_requires_grad(true);
  return result;
}

int64_t fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                         const std::optional<at::Tensor>& attn_mask, double dropout_p,
                         bool is_causal, std::optional<double> scale, bool enable_gqa) {
  std::optional<at::Tensor> mask;
  if (attn_mask.has_value() && attn_mask->defined()) mask = stand_in(*attn_mask);
  // Fake-tensor and other Python modes must not see this internal CPU call.
  const c10::impl::ExcludeDispatchKeyGuard no_python(
      c10::DispatchKeySet({c10::DispatchKey::Python, c10::DispatchKey::PythonTLSSnapshot}));
  return at::_fused_sdp_choice(stand_in(query), stand_in(key), stand_in(value), mask, dropout_p,
                               is_causal, scale, enable_gqa);
}

}  // namespace
}  // namespace torchneuron

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torchneuron::fused_sdp_choice)
}  // namespace at::native
