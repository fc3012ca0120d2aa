// ATen's fused attention ops on neuron: _scaled_dot_product_flash_attention and
// _scaled_dot_product_efficient_attention, forward and backward, with their logsumexp.
//
// DTensor's sharding strategies and context parallel's ring attention are written against
// these ops (and CUDA's SDPA reaches them), not against the CPU's
// _scaled_dot_product_flash_attention_for_cpu, which has no sharding rule: sdpa_backend_choice.cpp
// routes tensor subclasses here. Without dropout both run the CPU's flash kernel through the
// neuron `_for_cpu` ops (so the native decode kernel and the widened bf16 backward apply).
// With dropout they compute attention from its definition, with a keep-mask drawn from a
// seed: the forward draws the seed from the neuron generator (torch.neuron.manual_seed
// reproduces it) and returns it (efficient: philox_seed; flash: rng_state[0]); the mask is
// torch.rand(B, H, L, S, generator=torch.Generator().manual_seed(seed)) >= dropout_p on the
// CPU, so the backward, and a test, regenerate the same mask.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Operators.h>
#include <c10/core/SymInt.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>

#include "op_registrations.h"
#include "ops/op_tracking.h"

namespace torchneuron {
namespace {

// The softmax scale: the given one, else 1/sqrt(head_dim), as the CPU kernel computes it.
double softmax_scale(const at::Tensor& query, std::optional<double> scale) {
  return scale.has_value() ? *scale : 1.0 / std::sqrt(static_cast<double>(query.size(-1)));
}

void check_inputs(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                  const char* op) {
  TORCH_CHECK(query.dim() == 4 && key.dim() == 4 && value.dim() == 4, op,
              " on neuron takes (batch, heads, sequence, head_dim) query, key and value; got ",
              query.dim(), "-d, ", key.dim(), "-d and ", value.dim(), "-d");
  TORCH_CHECK(query.size(1) == key.size(1) && key.size(1) == value.size(1), op,
              " on neuron needs as many key/value heads as query heads (got ", query.size(1), ", ",
              key.size(1), ", ", value.size(1),
              "); repeat the key/value heads, or call scaled_dot_product_attention with "
              "enable_gqa=True");
}

// Draws a dropout seed from the device's generator (torch.neuron.manual_seed reproduces it).
at::Tensor draw_seed(const at::Tensor& query) {
  return at::randint(std::numeric_limits<int64_t>::max(), {},
                     query.options().dtype(at::kLong).requires_grad(false));
}

int64_t seed_value(const at::Tensor& seed) {
  return seed.flatten()[0].to(at::kLong).item<int64_t>();
}

// The keep-mask of a dropout seed, scaled by 1 / (1 - p): see the file comment.
at::Tensor keep_scaled(int64_t seed, double dropout_p, const at::Tensor& query,
                       const at::Tensor& key) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(seed));
  const at::Tensor uniform = at::rand({query.size(0), query.size(1), query.size(2), key.size(2)},
                                      generator, at::TensorOptions().dtype(at::kFloat));
  return (uniform >= dropout_p).to(at::kFloat).div_(1.0 - dropout_p).to(query.device());
}

// Scores of the definition, in float32: scale * q k^T, causal (top-left, as the CPU's) and
// bias applied.
at::Tensor scores_of(const at::Tensor& query, const at::Tensor& key, const at::Tensor& bias,
                     bool is_causal, double scale) {
  at::Tensor scores = at::matmul(query.to(at::kFloat), key.to(at::kFloat).transpose(-2, -1));
  scores.mul_(scale);
  if (is_causal) {
    const at::Tensor above =
        at::ones({query.size(2), key.size(2)}, query.options().dtype(at::kBool)).triu_(1);
    scores.masked_fill_(above, -std::numeric_limits<float>::infinity());
  }
  if (bias.defined()) {
    if (bias.scalar_type() == at::kBool) {
      scores.masked_fill_(bias.logical_not(), -std::numeric_limits<float>::infinity());
    } else {
      scores.add_(bias.to(at::kFloat));
    }
  }
  return scores;
}

// Forward from the definition with dropout: (output, logsumexp (B, H, L) float32).
std::tuple<at::Tensor, at::Tensor> dropout_forward(const at::Tensor& query, const at::Tensor& key,
                                                   const at::Tensor& value, const at::Tensor& bias,
                                                   double dropout_p, bool is_causal, double scale,
                                                   int64_t seed) {
  const at::Tensor scores = scores_of(query, key, bias, is_causal, scale);
  const at::Tensor lse = at::logsumexp(scores, -1);
  const at::Tensor probs = (scores - lse.unsqueeze(-1)).exp_();
  const at::Tensor kept = probs * keep_scaled(seed, dropout_p, query, key);
  return {at::matmul(kept, value.to(at::kFloat)).to(query.scalar_type()), lse};
}

// Backward from the definition (any dropout, and the bias's gradient): dq, dk, dv, dbias.
std::array<at::Tensor, 4> definition_backward(const at::Tensor& grad_out, const at::Tensor& query,
                                              const at::Tensor& key, const at::Tensor& value,
                                              const at::Tensor& bias, const at::Tensor& lse,
                                              double dropout_p, bool is_causal, double scale,
                                              int64_t seed, bool bias_grad) {
  const at::Tensor scores = scores_of(query, key, bias, is_causal, scale);
  const at::Tensor probs = (scores - lse.to(at::kFloat).unsqueeze(-1)).exp_();
  const at::Tensor g = grad_out.to(at::kFloat);
  at::Tensor kept = probs;
  at::Tensor grad_kept = at::matmul(g, value.to(at::kFloat).transpose(-2, -1));
  if (dropout_p > 0.0) {
    const at::Tensor keep = keep_scaled(seed, dropout_p, query, key);
    kept = probs * keep;
    grad_kept.mul_(keep);
  }
  const at::Tensor grad_value = at::matmul(kept.transpose(-2, -1), g);
  // softmax's backward: d scores = p * (dp - sum(dp * p))
  at::Tensor grad_scores = probs * (grad_kept - (grad_kept * probs).sum(-1, true));
  grad_scores.nan_to_num_(0.0);  // rows masked entirely
  const at::Tensor grad_query = at::matmul(grad_scores, key.to(at::kFloat)).mul_(scale);
  const at::Tensor grad_key =
      at::matmul(grad_scores.transpose(-2, -1), query.to(at::kFloat)).mul_(scale);
  at::Tensor grad_bias;
  if (bias_grad && bias.defined()) {
    grad_bias = at::sum_to(grad_scores, bias.sym_sizes()).to(bias.scalar_type());
  }
  return {grad_query.to(query.scalar_type()), grad_key.to(key.scalar_type()),
          grad_value.to(value.scalar_type()), grad_bias};
}

std::optional<at::Tensor> optional_of(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

// --- _scaled_dot_product_efficient_attention -----------------------------------------------

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> efficient_attention(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const std::optional<at::Tensor>& attn_bias, bool compute_log_sumexp, double dropout_p,
    bool is_causal, std::optional<double> scale) {
  static OpCounter& executed =
      op_counter_named("aten::_scaled_dot_product_efficient_attention");  // get_executed_ops()
  executed.executed.fetch_add(1, std::memory_order_relaxed);
  check_inputs(query, key, value, "_scaled_dot_product_efficient_attention");
  const at::Tensor bias = attn_bias.value_or(at::Tensor());
  at::Tensor out, lse, seed;
  if (dropout_p > 0.0) {
    seed = draw_seed(query);
    std::tie(out, lse) = dropout_forward(query, key, value, bias, dropout_p, is_causal,
                                         softmax_scale(query, scale), seed_value(seed));
  } else {
    seed = at::zeros({}, query.options().dtype(at::kLong));
    std::tie(out, lse) = at::_scaled_dot_product_flash_attention_for_cpu(
        query, key, value, 0.0, is_causal, attn_bias, scale);
  }
  // The output's layout is the CUDA kernel's (and torch's meta function's): a (batch, heads)
  // transpose of a (batch, sequence, heads, head_dim) tensor. The logsumexp has one column per
  // query row, as ROCm's kernel returns it; CUDA's pads them to a multiple of 32, which
  // context parallel's merge of ring blocks (it matches logsumexp rows to output rows) does
  // not accept for shards shorter than that. 0 columns when not asked for.
  at::Tensor strided =
      at::empty({query.size(0), query.size(2), query.size(1), value.size(3)}, out.options())
          .transpose(1, 2);
  strided.copy_(out);
  // Contiguous, as torch's meta function describes it (the CPU kernel's is a transpose).
  const at::Tensor lse_out = compute_log_sumexp
                                 ? lse.contiguous()
                                 : at::empty({query.size(0), query.size(1), 0}, lse.options());
  return {strided, lse_out, seed, at::zeros({}, query.options().dtype(at::kLong))};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> efficient_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key,
    const at::Tensor& value, const at::Tensor& attn_bias, const at::Tensor& out,
    const at::Tensor& logsumexp, const at::Tensor& philox_seed, const at::Tensor& /*philox_offset*/,
    double dropout_p, std::array<bool, 4> grad_input_mask, bool is_causal,
    std::optional<double> scale) {
  static OpCounter& executed = op_counter_named(
      "aten::_scaled_dot_product_efficient_attention_backward");  // get_executed_ops()
  executed.executed.fetch_add(1, std::memory_order_relaxed);
  check_inputs(query, key, value, "_scaled_dot_product_efficient_attention_backward");
  TORCH_CHECK(logsumexp.size(-1) >= query.size(2),
              "_scaled_dot_product_efficient_attention_backward needs the forward's logsumexp "
              "(compute_log_sumexp=True)");
  const at::Tensor lse = logsumexp.narrow(-1, 0, query.size(2)).contiguous();
  const bool bias_grad = grad_input_mask[3] && attn_bias.defined();
  if (dropout_p > 0.0 || bias_grad) {
    const int64_t seed = dropout_p > 0.0 ? seed_value(philox_seed) : 0;
    auto grads = definition_backward(grad_out, query, key, value, attn_bias, lse, dropout_p,
                                     is_causal, softmax_scale(query, scale), seed, bias_grad);
    return {grads[0], grads[1], grads[2], grads[3]};
  }
  auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
      grad_out, query, key, value, out, lse, 0.0, is_causal, optional_of(attn_bias), scale);
  return {dq, dk, dv, at::Tensor()};
}

// --- _scaled_dot_product_flash_attention ---------------------------------------------------

using FlashResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt,
                               c10::SymInt, at::Tensor, at::Tensor, at::Tensor>;

FlashResult flash_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                            double dropout_p, bool is_causal, bool return_debug_mask,
                            std::optional<double> scale) {
  static OpCounter& executed =
      op_counter_named("aten::_scaled_dot_product_flash_attention");  // get_executed_ops()
  executed.executed.fetch_add(1, std::memory_order_relaxed);
  check_inputs(query, key, value, "_scaled_dot_product_flash_attention");
  TORCH_CHECK(!return_debug_mask,
              "_scaled_dot_product_flash_attention on neuron does not return a debug mask "
              "(return_debug_mask=True); the attention weights are "
              "softmax(scale * q @ k^T) of the inputs");
  at::Tensor out, lse;
  int64_t seed = 0;
  if (dropout_p > 0.0) {
    seed = seed_value(draw_seed(query));
    std::tie(out, lse) = dropout_forward(query, key, value, at::Tensor(), dropout_p, is_causal,
                                         softmax_scale(query, scale), seed);
  } else {
    std::tie(out, lse) = at::_scaled_dot_product_flash_attention_for_cpu(
        query, key, value, 0.0, is_causal, std::nullopt, scale);
  }
  const auto u64 = query.options().dtype(at::kUInt64);
  // rng_state as CUDA's: (seed, offset); the offset is unused here.
  const at::Tensor rng_state =
      at::tensor({seed, int64_t{0}}, at::TensorOptions().dtype(at::kLong)).to(u64);
  // Distinct tensors: outputs of an op may not alias each other (torch checks this).
  const auto sequence_lengths = query.options().dtype(at::kLong);
  return {out,
          lse.contiguous(),  // as torch's meta function describes it
          at::empty({0}, sequence_lengths),
          at::empty({0}, sequence_lengths),
          c10::SymInt(query.size(2)),
          c10::SymInt(key.size(2)),
          rng_state,
          at::empty({}, u64),
          at::empty({0}, query.options())};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key,
    const at::Tensor& value, const at::Tensor& out, const at::Tensor& logsumexp,
    const at::Tensor& /*cum_seq_q*/, const at::Tensor& /*cum_seq_k*/, c10::SymInt /*max_q*/,
    c10::SymInt /*max_k*/, double dropout_p, bool is_causal, const at::Tensor& philox_seed,
    const at::Tensor& /*philox_offset*/, std::optional<double> scale) {
  static OpCounter& executed =
      op_counter_named("aten::_scaled_dot_product_flash_attention_backward");  // get_executed_ops()
  executed.executed.fetch_add(1, std::memory_order_relaxed);
  check_inputs(query, key, value, "_scaled_dot_product_flash_attention_backward");
  if (dropout_p > 0.0) {
    auto grads =
        definition_backward(grad_out, query, key, value, at::Tensor(), logsumexp, dropout_p,
                            is_causal, softmax_scale(query, scale), seed_value(philox_seed), false);
    return {grads[0], grads[1], grads[2]};
  }
  return at::_scaled_dot_product_flash_attention_for_cpu_backward(grad_out, query, key, value, out,
                                                                  logsumexp.contiguous(), 0.0,
                                                                  is_causal, std::nullopt, scale);
}

// --- the same ops in compiled graphs ----------------------------------------------------
//
// Compiled graphs run on CPU aliases of device memory (torchneuron/compile/backend.py), and
// the CPU has neither op: torchneuron/compile/device_only_ops.py points their nodes at
// torchneuron::efficient_attention / flash_attention (and backward), the same schemas with
// CPU kernels running the implementations above. Dropout is refused there: its seed comes
// from the neuron generator, which a graph running on the host cannot name.

void refuse_dropout_in_compiled_graphs(double dropout_p, const char* op) {
  TORCH_CHECK(dropout_p == 0.0, op,
              " with dropout (dropout_p > 0) is not supported in graphs compiled for neuron: "
              "its seed comes from the neuron generator. Run the attention eagerly (e.g. "
              "torch.compiler.disable around it), or set dropout_p=0 (eval mode).");
}

// Results are laid out as torch's meta functions describe them (device_only_ops.py uses those
// as the fake kernels): `t` copied into `layout`.
at::Tensor laid_out_as(at::Tensor layout, const at::Tensor& t) {
  return t.defined() ? layout.copy_(t) : t;
}

// Efficient attention's (batch, heads, rows, dim) results: a transpose of (b, rows, heads, dim).
at::Tensor rows_major(const at::Tensor& t) {
  return laid_out_as(
      at::empty({t.size(0), t.size(2), t.size(1), t.size(3)}, t.options()).transpose(1, 2), t);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> compiled_efficient_attention(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
    const std::optional<at::Tensor>& attn_bias, bool compute_log_sumexp, double dropout_p,
    bool is_causal, std::optional<double> scale) {
  refuse_dropout_in_compiled_graphs(dropout_p, "_scaled_dot_product_efficient_attention");
  auto [out, lse, seed, offset] = efficient_attention(
      query, key, value, attn_bias, compute_log_sumexp, dropout_p, is_causal, scale);
  if (compute_log_sumexp) {  // CUDA's layout: columns padded to a multiple of 32
    const int64_t rows = lse.size(-1);
    at::Tensor padded = at::zeros({lse.size(0), lse.size(1), (rows + 31) / 32 * 32}, lse.options());
    padded.narrow(-1, 0, rows).copy_(lse);
    lse = padded;
  }
  return {out, lse, seed, offset};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> compiled_efficient_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key,
    const at::Tensor& value, const at::Tensor& attn_bias, const at::Tensor& out,
    const at::Tensor& logsumexp, const at::Tensor& philox_seed, const at::Tensor& philox_offset,
    double dropout_p, std::array<bool, 4> grad_input_mask, bool is_causal,
    std::optional<double> scale) {
  auto [dq, dk, dv, dbias] = efficient_attention_backward(
      grad_out, query, key, value, attn_bias, out, logsumexp, philox_seed, philox_offset, dropout_p,
      grad_input_mask, is_causal, scale);
  return {rows_major(dq), rows_major(dk), rows_major(dv), dbias};
}

FlashResult compiled_flash_attention(const at::Tensor& query, const at::Tensor& key,
                                     const at::Tensor& value, double dropout_p, bool is_causal,
                                     bool return_debug_mask, std::optional<double> scale) {
  refuse_dropout_in_compiled_graphs(dropout_p, "_scaled_dot_product_flash_attention");
  FlashResult result =
      flash_attention(query, key, value, dropout_p, is_causal, return_debug_mask, scale);
  std::get<0>(result) = laid_out_as(at::empty_like(query), std::get<0>(result));
  std::get<1>(result) = std::get<1>(result).contiguous();
  return result;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> compiled_flash_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key,
    const at::Tensor& value, const at::Tensor& out, const at::Tensor& logsumexp,
    const at::Tensor& cum_seq_q, const at::Tensor& cum_seq_k, c10::SymInt max_q, c10::SymInt max_k,
    double dropout_p, bool is_causal, const at::Tensor& philox_seed,
    const at::Tensor& philox_offset, std::optional<double> scale) {
  auto [dq, dk, dv] = flash_attention_backward(
      grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, std::move(max_q),
      std::move(max_k), dropout_p, is_causal, philox_seed, philox_offset, scale);
  return {laid_out_as(at::empty_like(query), dq), laid_out_as(at::empty_like(key), dk),
          laid_out_as(at::empty_like(value), dv)};
}

}  // namespace

void define_fused_attention_ops(torch::Library& m) {
  m.def(
      "efficient_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_bias, "
      "bool compute_log_sumexp, float dropout_p=0., bool is_causal=False, *, "
      "float? scale=None) -> (Tensor output, Tensor log_sumexp, Tensor philox_seed, "
      "Tensor philox_offset)");
  m.def(
      "efficient_attention_backward(Tensor grad_out_, Tensor query, Tensor key, Tensor value, "
      "Tensor attn_bias, Tensor out, Tensor logsumexp, Tensor philox_seed, "
      "Tensor philox_offset, float dropout_p, bool[4] grad_input_mask, bool is_causal=False, "
      "*, float? scale=None) -> (Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "flash_attention(Tensor query, Tensor key, Tensor value, float dropout_p=0., "
      "bool is_causal=False, bool return_debug_mask=False, *, float? scale=None) -> "
      "(Tensor output, Tensor logsumexp, Tensor cum_seq_q, Tensor cum_seq_k, SymInt max_q, "
      "SymInt max_k, Tensor rng_state, Tensor unused, Tensor debug_attn_mask)");
  m.def(
      "flash_attention_backward(Tensor grad_out, Tensor query, Tensor key, Tensor value, "
      "Tensor out, Tensor logsumexp, Tensor cum_seq_q, Tensor cum_seq_k, SymInt max_q, "
      "SymInt max_k, float dropout_p, bool is_causal, Tensor philox_seed, "
      "Tensor philox_offset, *, float? scale=None) -> (Tensor grad_query, Tensor grad_key, "
      "Tensor grad_value)");
}

void register_fused_attention_cpu(torch::Library& m) {
  m.impl("efficient_attention", TORCH_FN(compiled_efficient_attention));
  m.impl("efficient_attention_backward", TORCH_FN(compiled_efficient_attention_backward));
  m.impl("flash_attention", TORCH_FN(compiled_flash_attention));
  m.impl("flash_attention_backward", TORCH_FN(compiled_flash_attention_backward));
}

void register_fused_attention(torch::Library& m) {
  m.impl("_scaled_dot_product_efficient_attention", TORCH_FN(efficient_attention));
  m.impl("_scaled_dot_product_efficient_attention_backward",
         TORCH_FN(efficient_attention_backward));
  m.impl("_scaled_dot_product_flash_attention", TORCH_FN(flash_attention));
  m.impl("_scaled_dot_product_flash_attention_backward", TORCH_FN(flash_attention_backward));
}

}  // namespace torchneuron
