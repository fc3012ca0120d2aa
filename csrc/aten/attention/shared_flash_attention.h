// PyTorch's CPU flash attention (forward and backward) on the neuron device, split in two
// tasks over the task board (shared_flash_attention.cpp). Called by the neuron kernels of
// the two ops (native_attention_decode.cpp, attention_backward_widened.cpp) for what their
// own paths do not take.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <tuple>

namespace torchneuron {

// The forward's (output, logsumexp), or nullopt where the problem is not split (dropout, too
// small, no board here, shapes the split does not cover): the caller runs the kernel whole.
std::optional<std::tuple<at::Tensor, at::Tensor>> shared_flash_attention(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, double dropout_p,
    bool is_causal, const std::optional<at::Tensor>& attn_mask, std::optional<double> scale);

// The backward's (grad_query, grad_key, grad_value), or nullopt as above.
std::optional<std::tuple<at::Tensor, at::Tensor, at::Tensor>> shared_flash_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key,
    const at::Tensor& value, const at::Tensor& out, const at::Tensor& logsumexp, double dropout_p,
    bool is_causal, const std::optional<at::Tensor>& attn_mask, std::optional<double> scale);

}  // namespace torchneuron
