"""Layers `kernels.kernelize` swaps in: stateless classes whose ``forward`` replaces the
model's own, reading the model module's parameters (``self.weight``, ``self.q_proj``...)."""

import torch
from torch import nn

from .nki_kernels import rmsnorm_kernel, vit_attention_kernel


class RMSNorm(nn.Module):
    """For modules marked ``@use_kernel_forward_from_hub("RMSNorm")`` (e.g. LlamaRMSNorm:
    ``self.weight``, ``self.variance_epsilon``)."""

    has_backward = False

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        shape = hidden_states.shape
        rows = hidden_states.reshape(-1, shape[-1])
        out = rmsnorm_kernel(rows, self.weight, float(self.variance_epsilon))
        return out.reshape(shape)


class ViTAttention(nn.Module):
    """For transformers' ViTAttention (q/k/v/o projections, ``num_attention_heads``,
    ``head_dim``, ``scaling``): the projections stay torch ops, softmax(QK^T)V is one NKI
    kernel. Inference only; no attention mask or head mask (ViT passes none)."""

    has_backward = False

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        **kwargs: object,
    ) -> tuple[torch.Tensor, None]:
        if attention_mask is not None:
            raise ValueError("the nki-vit ViTAttention kernel takes no attention mask")
        batch, seq, _ = hidden_states.shape
        heads, d = self.num_attention_heads, self.head_dim
        q = self.q_proj(hidden_states).view(batch, seq, heads, d)
        k = self.k_proj(hidden_states).view(batch, seq, heads, d)
        v = self.v_proj(hidden_states).view(batch, seq, heads, d)
        attn = vit_attention_kernel(
            q.permute(0, 2, 3, 1), k.permute(0, 2, 3, 1), v.permute(0, 2, 1, 3), self.scaling
        )
        return self.o_proj(attn.reshape(batch, seq, heads * d)), None
