// aten::_flash_attention_forward / _flash_attention_backward on neuron: the ops behind
// torch.nn.attention.varlen.varlen_attn (sequences of different lengths packed into one
// (total, heads, head_dim) tensor, delimited by cumulative lengths) and, without cumulative
// lengths, dense (batch, sequence, heads, head_dim) attention.
//
// Each sequence runs the CPU's flash kernel through the neuron `_for_cpu` ops, with its mask
// built as FlashAttention defines it: query i of a sequence of q_len queries and k_len keys
// sees key j when i + k_len - q_len - left <= j <= i + k_len - q_len + right (a window,
// aligned to the bottom right; causal is right = 0; -1 means unbounded). Key/value heads
// fewer than query heads (grouped-query attention) are shared by consecutive query heads.
// Dropout, ALiBi slopes, per-sequence key lengths and paged caches (block_table) are refused
// with an error naming them; num_splits only tunes CUDA's kernel and is ignored.
#include <ATen/ATen.h>
#include <ATen/Operators.h>
#include <c10/core/SymInt.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "op_registrations.h"
#include "ops/op_tracking.h"

namespace torchneuron {
namespace {

struct Window {
  int64_t left = -1;   // keys before the diagonal a query sees; -1: all
  int64_t right = -1;  // keys after it; -1: all
};

Window window_of(bool is_causal, const std::optional<c10::SymInt>& left,
                 const std::optional<c10::SymInt>& right) {
  Window w;
  if (left.has_value()) w.left = left->guard_int(__FILE__, __LINE__);
  if (right.has_value()) w.right = right->guard_int(__FILE__, __LINE__);
  if (is_causal) w.right = 0;
  return w;
}

// The additive mask (0 or -inf, in `dtype`) of a q_len x k_len block, or nullopt when every
// key is visible.
std::optional<at::Tensor> mask_of(const Window& w, int64_t q_len, int64_t k_len,
                                  const at::TensorOptions& options) {
  if (w.left < 0 && w.right < 0) return std::nullopt;
  const at::Tensor rows = at::arange(q_len, options.dtype(at::kLong)).unsqueeze(1);
  const at::Tensor cols = at::arange(k_len, options.dtype(at::kLong)).unsqueeze(0);
  const at::Tensor diagonal = rows + (k_len - q_len);
  at::Tensor visible = at::ones({q_len, k_len}, options.dtype(at::kBool));
  if (w.left >= 0) visible = visible.logical_and(cols >= diagonal - w.left);
  if (w.right >= 0) visible = visible.logical_and(cols <= diagonal + w.right);
  return at::zeros({q_len, k_len}, options)
      .masked_fill_(visible.logical_not(), -std::numeric_limits<double>::infinity());
}

void refuse_unsupported(double dropout_p, bool return_debug_mask,
                        const std::optional<at::Tensor>& seqused_k,
                        const std::optional<at::Tensor>& alibi_slopes,
                        const std::optional<at::Tensor>& block_table) {
  const char* what = dropout_p > 0.0            ? "dropout (dropout_p > 0)"
                     : return_debug_mask        ? "return_debug_mask=True"
                     : seqused_k.has_value()    ? "per-sequence key lengths (seqused_k)"
                     : alibi_slopes.has_value() ? "ALiBi slopes (alibi_slopes)"
                     : block_table.has_value()  ? "a paged key/value cache (block_table)"
                                                : nullptr;
  TORCH_CHECK(what == nullptr, "_flash_attention_forward on neuron does not support ", what,
              "; scaled_dot_product_attention (with an attention mask) covers these cases");
}

// (sequence, heads, head_dim) -> (1, heads, sequence, head_dim), key/value heads repeated
// to the query's `heads`.
at::Tensor heads_first(const at::Tensor& t, int64_t heads) {
  at::Tensor bhsd = t.transpose(0, 1).unsqueeze(0);
  const int64_t group = heads / t.size(1);
  return group == 1 ? bhsd : bhsd.repeat_interleave(group, 1);
}

// A repeated key/value head's gradient, summed back over its group: (1, heads, s, d) ->
// (s, kv_heads, d).
at::Tensor grouped_grad(const at::Tensor& grad, int64_t kv_heads) {
  const int64_t heads = grad.size(1);
  at::Tensor g = grad.squeeze(0);
  if (heads != kv_heads) {
    g = g.view({kv_heads, heads / kv_heads, g.size(1), g.size(2)}).sum(1);
  }
  return g.transpose(0, 1);
}

// The [begin, end) rows of each sequence: from cumulative lengths, or `batch` equal blocks.
std::vector<std::pair<int64_t, int64_t>> spans(const std::optional<at::Tensor>& cumulative,
                                               int64_t batch, int64_t length) {
  std::vector<std::pair<int64_t, int64_t>> out;
  if (cumulative.has_value() && cumulative->defined()) {
    const at::Tensor c = cumulative->to(at::kCPU, at::kLong).contiguous();
    const int64_t* p = c.const_data_ptr<int64_t>();
    for (int64_t i = 0; i + 1 < c.numel(); ++i) {
      TORCH_CHECK(p[i] <= p[i + 1], "cumulative sequence lengths must not decrease");
      out.emplace_back(p[i], p[i + 1]);
    }
    return out;
  }
  for (int64_t b = 0; b < batch; ++b) out.emplace_back(b * length, (b + 1) * length);
  return out;
}

// Dense (batch, sequence, heads, d) inputs as packed (batch * sequence, heads, d).
at::Tensor packed(const at::Tensor& t, bool dense) {
  return dense ? t.reshape({t.size(0) * t.size(1), t.size(2), t.size(3)}) : t;
}

using ForwardResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

ForwardResult flash_forward(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const std::optional<at::Tensor>& cum_seq_q, const std::optional<at::Tensor>& cum_seq_k,
    c10::SymInt /*max_q*/, c10::SymInt /*max_k*/, double dropout_p, bool is_causal,
    bool return_debug_mask, std::optional<double> scale,
    std::optional<c10::SymInt> window_size_left, std::optional<c10::SymInt> window_size_right,
    const std::optional<at::Tensor>& seqused_k, const std::optional<at::Tensor>& alibi_slopes,
    const std::optional<at::Tensor>& block_table, std::optional<int64_t> /*num_splits*/) {
  static OpCounter& executed =
      op_counter_named("aten::_flash_attention_forward");  // get_executed_ops()
  executed.executed.fetch_add(1, std::memory_order_relaxed);
  refuse_unsupported(dropout_p, return_debug_mask, seqused_k, alibi_slopes, block_table);
  const bool dense = !cum_seq_q.has_value() || !cum_seq_q->defined();
  TORCH_CHECK(query.dim() == (dense ? 4 : 3),
              "_flash_attention_forward on neuron takes (total, heads, head_dim) with "
              "cumulative lengths, or (batch, sequence, heads, head_dim) without; got a ",
              query.dim(), "-d query");
  const at::Tensor q = packed(query, dense), k = packed(key, dense), v = packed(value, dense);
  const int64_t heads = q.size(1);
  TORCH_CHECK(k.size(1) > 0 && heads % k.size(1) == 0 && k.size(1) == v.size(1),
              "_flash_attention_forward: query heads (", heads,
              ") must be a multiple of the key/value heads (", k.size(1), ", ", v.size(1), ")");
  const auto q_spans = spans(cum_seq_q, dense ? query.size(0) : 0, dense ? query.size(1) : 0);
  const auto k_spans = spans(cum_seq_k, dense ? key.size(0) : 0, dense ? key.size(1) : 0);
  TORCH_CHECK(q_spans.size() == k_spans.size(), "cum_seq_q and cum_seq_k name ", q_spans.size(),
              " and ", k_spans.size(), " sequences");
  const Window w = window_of(is_causal, window_size_left, window_size_right);
  at::Tensor out = at::empty_like(q);
  at::Tensor lse = at::empty({heads, q.size(0)}, q.options().dtype(at::kFloat));
  for (size_t i = 0; i < q_spans.size(); ++i) {
    const auto [q0, q1] = q_spans[i];
    const auto [k0, k1] = k_spans[i];
    if (q1 == q0) continue;
    const auto mask = mask_of(w, q1 - q0, k1 - k0, q.options());
    auto [o, l] = at::_scaled_dot_product_flash_attention_for_cpu(
        heads_first(q.slice(0, q0, q1), heads), heads_first(k.slice(0, k0, k1), heads),
        heads_first(v.slice(0, k0, k1), heads), 0.0, false, mask, scale);
    out.slice(0, q0, q1).copy_(o.squeeze(0).transpose(0, 1));
    lse.slice(1, q0, q1).copy_(l.squeeze(0));
  }
  if (dense) {
    out = out.view(query.sizes());
    lse = lse.view({heads, query.size(0), query.size(1)}).transpose(0, 1).contiguous();
  }
  const auto u64 = query.options().dtype(at::kUInt64);
  return {out, lse, at::zeros({2}, u64), at::empty({0}, u64), at::empty({0}, query.options())};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key,
    const at::Tensor& value, const at::Tensor& out, const at::Tensor& logsumexp,
    const at::Tensor& cum_seq_q, const at::Tensor& cum_seq_k, c10::SymInt /*max_q*/,
    c10::SymInt /*max_k*/, double dropout_p, bool is_causal, const at::Tensor& /*rng_state*/,
    const at::Tensor& /*unused*/, std::optional<double> scale,
    std::optional<c10::SymInt> window_size_left, std::optional<c10::SymInt> window_size_right) {
  static OpCounter& executed =
      op_counter_named("aten::_flash_attention_backward");  // get_executed_ops()
  executed.executed.fetch_add(1, std::memory_order_relaxed);
  TORCH_CHECK(dropout_p == 0.0, "_flash_attention_backward on neuron does not support dropout");
  const bool dense = !cum_seq_q.defined();
  const at::Tensor q = packed(query, dense), k = packed(key, dense), v = packed(value, dense);
  const at::Tensor g = packed(grad_out, dense), o = packed(out, dense);
  const int64_t heads = q.size(1);
  // logsumexp as (heads, total): dense ones are (batch, heads, sequence)
  const at::Tensor lse = dense ? logsumexp.transpose(0, 1).reshape({heads, q.size(0)}) : logsumexp;
  const auto q_spans = spans(dense ? std::nullopt : std::optional<at::Tensor>(cum_seq_q),
                             dense ? query.size(0) : 0, dense ? query.size(1) : 0);
  const auto k_spans = spans(dense ? std::nullopt : std::optional<at::Tensor>(cum_seq_k),
                             dense ? key.size(0) : 0, dense ? key.size(1) : 0);
  const Window w = window_of(is_causal, window_size_left, window_size_right);
  at::Tensor dq = at::zeros_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
  for (size_t i = 0; i < q_spans.size(); ++i) {
    const auto [q0, q1] = q_spans[i];
    const auto [k0, k1] = k_spans[i];
    if (q1 == q0) continue;
    const auto mask = mask_of(w, q1 - q0, k1 - k0, q.options());
    auto [gq, gk, gv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        heads_first(g.slice(0, q0, q1), heads), heads_first(q.slice(0, q0, q1), heads),
        heads_first(k.slice(0, k0, k1), heads), heads_first(v.slice(0, k0, k1), heads),
        heads_first(o.slice(0, q0, q1), heads), lse.slice(1, q0, q1).unsqueeze(0).contiguous(), 0.0,
        false, mask, scale);
    dq.slice(0, q0, q1).copy_(gq.squeeze(0).transpose(0, 1));
    dk.slice(0, k0, k1).add_(grouped_grad(gk, k.size(1)));
    dv.slice(0, k0, k1).add_(grouped_grad(gv, v.size(1)));
  }
  if (dense) return {dq.view(query.sizes()), dk.view(key.sizes()), dv.view(value.sizes())};
  return {dq, dk, dv};
}

// torch.nn.attention.varlen's custom ops (torch_attn::_varlen_attn, _varlen_attn_backward)
// again as torchneuron::varlen_attn / varlen_attn_backward, with the same schemas, for compiled
// graphs: those run on CPU aliases of device memory (torchneuron/compile/backend.py), where
// torch_attn's implementation would call aten::_flash_attention_forward on the CPU, which has
// no kernel. torchneuron/compile/device_only_ops.py retargets the nodes to these, whose CPU
// kernels run the implementation above, as eager neuron calls do.
std::pair<std::optional<c10::SymInt>, std::optional<c10::SymInt>> window_sizes(
    at::OptionalSymIntArrayRef window_size) {
  if (!window_size.has_value()) return {std::nullopt, std::nullopt};
  TORCH_CHECK(window_size->size() == 2, "varlen_attn: window_size takes (left, right), got ",
              window_size->size(), " values");
  return {(*window_size)[0], (*window_size)[1]};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_attn(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const at::Tensor& cu_seq_q, const std::optional<at::Tensor>& cu_seq_k, c10::SymInt max_q,
    c10::SymInt max_k, bool is_causal, std::optional<double> scale,
    at::OptionalSymIntArrayRef window_size, bool /*enable_gqa: heads decide*/,
    const std::optional<at::Tensor>& seqused_k, const std::optional<at::Tensor>& block_table,
    std::optional<c10::SymInt> num_splits) {
  const auto [left, right] = window_sizes(window_size);
  std::optional<int64_t> splits;
  if (num_splits.has_value()) splits = num_splits->guard_int(__FILE__, __LINE__);
  auto [out, lse, rng_state, unused_offset, unused_mask] = flash_forward(
      query, key, value, cu_seq_q, cu_seq_k, std::move(max_q), std::move(max_k), 0.0, is_causal,
      false, scale, left, right, seqused_k, std::nullopt, block_table, splits);
  return {out, lse, rng_state};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> varlen_attn_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key,
    const at::Tensor& value, const at::Tensor& out, const at::Tensor& lse,
    const at::Tensor& cu_seq_q, const at::Tensor& cu_seq_k, c10::SymInt max_q, c10::SymInt max_k,
    bool is_causal, const at::Tensor& rng_state, std::optional<double> scale,
    at::OptionalSymIntArrayRef window_size) {
  const auto [left, right] = window_sizes(window_size);
  return flash_backward(grad_out, query, key, value, out, lse, cu_seq_q, cu_seq_k, std::move(max_q),
                        std::move(max_k), 0.0, is_causal, rng_state,
                        at::empty({0}, query.options()), scale, left, right);
}

}  // namespace

void define_varlen_attention_ops(torch::Library& m) {
  m.def(
      "varlen_attn(Tensor query, Tensor key, Tensor value, Tensor cu_seq_q, Tensor? cu_seq_k, "
      "SymInt max_q, SymInt max_k, bool is_causal=False, float? scale=None, "
      "SymInt[]? window_size=None, bool enable_gqa=False, Tensor? seqused_k=None, "
      "Tensor? block_table=None, SymInt? num_splits=None) -> (Tensor, Tensor, Tensor)");
  m.def(
      "varlen_attn_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, "
      "Tensor out, Tensor lse, Tensor cu_seq_q, Tensor cu_seq_k, SymInt max_q, SymInt max_k, "
      "bool is_causal, Tensor rng_state, float? scale=None, SymInt[]? window_size=None) -> "
      "(Tensor, Tensor, Tensor)");
}

void register_varlen_attention_cpu(torch::Library& m) {
  m.impl("varlen_attn", TORCH_FN(varlen_attn));
  m.impl("varlen_attn_backward", TORCH_FN(varlen_attn_backward));
}

void register_varlen_attention(torch::Library& m) {
  m.impl("_flash_attention_forward", TORCH_FN(flash_forward));
  m.impl("_flash_attention_backward", TORCH_FN(flash_backward));
}

}  // namespace torchneuron
