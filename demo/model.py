"""The model: a Llama-style causal LM (RMSNorm, RoPE, SwiGLU, grouped-query attention) from a
config, with seeded random weights; nothing is downloaded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import LlamaForCausalLM, PreTrainedTokenizerFast


@dataclass(frozen=True)
class ModelSize:
    """The shape of one model size."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int


MODEL_SIZES: dict[str, ModelSize] = {
    "tiny": ModelSize(hidden=192, layers=3, heads=6, kv_heads=6, intermediate=512),
    "small": ModelSize(hidden=256, layers=4, heads=8, kv_heads=4, intermediate=768),
    "base": ModelSize(hidden=512, layers=8, heads=8, kv_heads=4, intermediate=1536),
}


def build_model(
    size: str, tokenizer: PreTrainedTokenizerFast, max_length: int, seed: int
) -> LlamaForCausalLM:
    """A seeded, randomly initialised ``LlamaForCausalLM`` of ``size`` in float32, on the CPU."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if size not in MODEL_SIZES:
        raise ValueError(f"unknown model size {size!r}; choose one of {', '.join(MODEL_SIZES)}")
    shape = MODEL_SIZES[size]
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=max_length,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def parameter_count(model: torch.nn.Module) -> int:
    """Number of parameters (each shared tensor counted once)."""
    return sum(p.numel() for p in model.parameters())
