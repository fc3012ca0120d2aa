// aten::_scaled_dot_product_flash_attention_for_cpu_backward on the neuron device.
//
// On hosts without native bf16 (below AVX512-BF16), PyTorch's CPU flash-attention backward
// in bfloat16 multiplies its blocks through emulated bf16 GEMMs: on the 20M Llama training
// step of benchmarks/training.py it took 34 ms a call against 6.7 ms in float32, 15% of the
// bf16 step. There, bf16 operands are widened to float32 on the device, the float32 backward
// runs, and the gradients are rounded to bf16 once: one rounding instead of the CPU kernel's
// several (it also rounds probabilities and their gradients to bf16 between its GEMMs), so
// the gradients are closer to exact, within bf16 tolerance of the CPU's. Only from
// kMinWidenedWork per head: below it the widening copies cost more than they save (measured
// on an AVX2 host, 1 thread: 0.6x at 8 rows × 8 × 16, 1.4x at 16 × 16 × 32, 2.5x at
// 32 × 32 × 32, 6.2x at 128 × 128 × 64). Everything else (smaller problems, other dtypes,
// hosts with native bf16, TORCHNEURON_NATIVE_KERNELS=0) runs the CPU kernel over host
// aliases, launched like any op (split over the task board, shared_flash_attention.h), with
// the CPU's results bit for bit. Compiled graphs run
// over host memory, so their backward node is retargeted to torchneuron::
// sdpa_backward_widened (defined here, CPU kernel), which decides the same way.
#include <ATen/Operators.h>
#include <ATen/native/CPUFallback.h>
#include <torch/library.h>

#include <atomic>
#include <optional>
#include <tuple>

#include "attention/shared_flash_attention.h"
#include "cpu_features.h"
#include "host_kernels/host_kernel_executor.h"
#include "launch/async_launch.h"
#include "native/native_kernel_switch.h"
#include "op_registrations.h"

namespace torchneuron {
namespace {

namespace nk = neuron::kernels;
using Op = at::_ops::_scaled_dot_product_flash_attention_for_cpu_backward;

// Query rows × key rows × head size of one head's backward.
constexpr int64_t kMinWidenedWork = 16 * 16 * 32;

// Whether this backward widens: bf16 operands on `device_type`, a host without native bf16,
// native kernels on, and enough work per head to repay the copies.
bool widen_bf16(const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key,
                const at::Tensor& value, const at::Tensor& out, c10::DeviceType device_type) {
  static const bool host_lacks_bf16 = nk::isa_level() < nk::IsaLevel::kAvx512Bf16;
  if (!host_lacks_bf16 || !native_kernels_enabled()) return false;
  for (const at::Tensor* t : {&grad_out, &query, &key, &value, &out}) {
    if (t->scalar_type() != at::kBFloat16 || t->device().type() != device_type || t->dim() < 2) {
      return false;
    }
  }
  return query.size(-2) * key.size(-2) * query.size(-1) >= kMinWidenedWork;
}

// The backward in float32 on the operands' own device, its gradients rounded to bf16 once.
std::tuple<at::Tensor, at::Tensor, at::Tensor> widened_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key,
    const at::Tensor& value, const at::Tensor& out, const at::Tensor& logsumexp, double dropout_p,
    bool is_causal, const std::optional<at::Tensor>& attn_mask, std::optional<double> scale) {
  static std::atomic<uint64_t>& runs = native_kernel_counter("flash_attention_backward_widened");
  const auto wide = [](const at::Tensor& t) { return t.to(at::kFloat); };
  std::optional<at::Tensor> mask = attn_mask;
  if (mask.has_value() && mask->defined() && mask->scalar_type() == at::kBFloat16) {
    mask = wide(*mask);
  }
  auto [grad_q, grad_k, grad_v] = Op::call(wide(grad_out), wide(query), wide(key), wide(value),
                                           wide(out), logsumexp, dropout_p, is_causal, mask, scale);
  runs.fetch_add(1, std::memory_order_relaxed);
  return {grad_q.to(at::kBFloat16), grad_k.to(at::kBFloat16), grad_v.to(at::kBFloat16)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key,
    const at::Tensor& value, const at::Tensor& out, const at::Tensor& logsumexp, double dropout_p,
    bool is_causal, const std::optional<at::Tensor>& attn_mask, std::optional<double> scale) {
  if (widen_bf16(grad_out, query, key, value, out, c10::DeviceType::PrivateUse1)) {
    return widened_backward(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal,
                            attn_mask, scale);
  }
  if (auto results = launch_results_or_wait<Op>(grad_out, query, key, value, out, logsumexp,
                                                dropout_p, is_causal, attn_mask, scale)) {
    return {std::move((*results)[0]).toTensor(), std::move((*results)[1]).toTensor(),
            std::move((*results)[2]).toTensor()};
  }
  if (auto shared = shared_flash_attention_backward(grad_out, query, key, value, out, logsumexp,
                                                    dropout_p, is_causal, attn_mask, scale)) {
    return *std::move(shared);
  }
  return at::native::call_fallback_fn<&run_on_host_kernels_boxed, Op>::call(
      grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, attn_mask, scale);
}

// torchneuron::sdpa_backward_widened: the op compiled graphs call in place of the bf16
// backward (torchneuron/compile/native_attention.py), over host memory; the CPU kernel where
// widening does not apply.
std::tuple<at::Tensor, at::Tensor, at::Tensor> host_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key,
    const at::Tensor& value, const at::Tensor& out, const at::Tensor& logsumexp, double dropout_p,
    bool is_causal, const std::optional<at::Tensor>& attn_mask, std::optional<double> scale) {
  if (widen_bf16(grad_out, query, key, value, out, c10::DeviceType::CPU)) {
    return widened_backward(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal,
                            attn_mask, scale);
  }
  return Op::call(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, attn_mask,
                  scale);
}

}  // namespace

void define_attention_backward_widened_ops(torch::Library& m) {
  m.def(
      "sdpa_backward_widened(Tensor grad_out, Tensor query, Tensor key, Tensor value, "
      "Tensor out, Tensor logsumexp, float dropout_p, bool is_causal, *, Tensor? attn_mask=None, "
      "float? scale=None) -> (Tensor, Tensor, Tensor)");
}

void register_attention_backward_widened_cpu(torch::Library& m) {
  m.impl("sdpa_backward_widened", TORCH_FN(host_backward));
}

void register_attention_backward_widened(torch::Library& m) {
  m.impl("_scaled_dot_product_flash_attention_for_cpu_backward",
         TORCH_FN(flash_attention_backward));
}

}  // namespace torchneuron
