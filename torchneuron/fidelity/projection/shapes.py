"""Transformer shapes of the models in AWS's published figures, and what one token costs in
each layer: matmul FLOPs, attention FLOPs, and the elementwise work of norms, activations and
residuals.

Dimensions are the models' published configurations (Hugging Face config.json of each model;
for GPT3-23B/46B/175B, neuronx-nemo-megatron's gpt_23b.sh, gpt_46b.sh and gpt_175b.sh).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    gated_mlp: bool = True  # SwiGLU (three matrices) or GELU (two)
    causal: bool = True
    experts: int = 0  # mixture of experts: MLPs per layer (0: one dense MLP)
    experts_per_token: int = 0  # the router's top-k

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def moe(self) -> bool:
        return self.experts > 0

    def _mlp(self) -> int:
        """Weights of one MLP (one expert's, in a mixture of experts)."""
        return (3 if self.gated_mlp else 2) * self.hidden * self.ffn

    def _mlps_per_token(self) -> int:
        return self.experts_per_token if self.moe else 1

    def expert_parameters(self) -> int:
        """Weights of every expert MLP (0 for a dense model): what expert parallelism shards."""
        return self.layers * self.experts * self._mlp() if self.moe else 0

    def parameters(self) -> int:
        h = self.hidden
        attention = h * h * 2 + 2 * h * self.kv_heads * self.head_dim
        router = h * self.experts
        mlp = self._mlp() * (self.experts if self.moe else 1)
        return self.layers * (attention + router + mlp) + 2 * self.vocab * h

    def active_parameters(self) -> int:
        """Weights one token passes through: a mixture of experts' top-k experts only."""
        if not self.moe:
            return self.parameters()
        inactive = self.experts - self.experts_per_token
        return self.parameters() - self.layers * inactive * self._mlp()

    def heads_per_rank(self, tp: int) -> int:
        """Query heads each TP rank holds: the heads padded to a multiple of tp (NxD Inference
        pads Q heads; libraries/nxd-inference/developer_guides/feature-guide.rst:858-873)."""
        return math.ceil(self.heads / tp)

    def kv_heads_per_rank(self, tp: int) -> int:
        """KV heads each TP rank holds, by the sharding NxD Inference picks
        (feature-guide.rst:858-873; transformers-neuronx's GQA strategies are the same cases):
        divided when tp divides them, one replicated head per rank when they divide tp
        (REPLICATE_TO_TP_DEGREE), otherwise one per query head (CONVERT_TO_MHA)."""
        if self.kv_heads % tp == 0:
            return self.kv_heads // tp
        if tp % self.kv_heads == 0:
            return 1
        return self.heads_per_rank(tp)

    def as_multi_head(self) -> Shape:
        """The model with one KV head per query head: how transformers-neuronx up to SDK 2.18
        shards a grouped-query model whose KV heads tp does not divide ("replicate the KV heads
        to be equal to the number of Q heads. This makes the GQA model look identical to an
        MHA model": aws-neuron/transformers-neuronx@0623de2, decoder.py, the KV weights
        repeated in ``to_neuron``). Its successor replicates only up to one head per rank."""
        return replace(self, kv_heads=self.heads)

    def _non_mlp_weights_per_rank(self, tp: int) -> int:
        """A layer's attention projections on one TP rank and its router (if any)."""
        h, d = self.hidden, self.head_dim
        attention = 2 * h * self.heads_per_rank(tp) * d + 2 * h * self.kv_heads_per_rank(tp) * d
        return attention + h * self.experts

    def layer_weights_per_rank(self, tp: int, ep: int = 1) -> int:
        """Elements of one layer's projection weights on one TP rank, padded heads included;
        a mixture of experts' experts divided over `ep` expert-parallel ranks, its router
        whole."""
        mlps = self.experts // ep if self.moe else 1
        return self._non_mlp_weights_per_rank(tp) + mlps * self._mlp() // tp

    def layer_decode_weights_per_rank(self, tp: int, tokens: int) -> float:
        """Weights one decode step of `tokens` tokens reads on one TP rank: of a mixture of
        experts, only the experts its tokens are routed to, E x (1 - (1 - k/E)^tokens) of
        them on average under uniform routing."""
        if not self.moe:
            return self.layer_weights_per_rank(tp)
        untouched = (1 - self.experts_per_token / self.experts) ** tokens
        touched = self.experts * (1 - untouched)
        return self._non_mlp_weights_per_rank(tp) + touched * self._mlp() / tp

    def layer_matmul_flops(self, tokens: int, tp: int) -> float:
        """Forward FLOPs of one layer's projections for `tokens` tokens on one TP rank (each
        token through its top-k experts in a mixture of experts, and the router)."""
        mlp = self._mlps_per_token() * self._mlp() // tp
        return 2.0 * tokens * (self._non_mlp_weights_per_rank(tp) + mlp)

    def layer_attention_flops(
        self, batch: int, queries: int, keys: int, tp: int, flash: bool = True
    ) -> float:
        """Forward FLOPs of QK^T and AV on one TP rank; a causal flash kernel skips masked
        blocks, materialised attention computes every score and masks it."""
        pairs = queries * keys
        if self.causal and queries == keys and flash:
            pairs = queries * (keys + 1) / 2
        return 2.0 * 2.0 * batch * pairs * self.heads_per_rank(tp) * self.head_dim

    def layer_elementwise(self, tokens: int, tp: int, sequence_parallel: bool) -> float:
        """Elements one TP rank's Vector engine passes over in one layer's forward: two norms
        and two residual adds on the hidden state (divided by tp under sequence parallelism),
        rotary embedding on q and k, the MLP activation (and gate product)."""
        hidden_share = self.hidden / (tp if sequence_parallel else 1)
        residual_stream = 2 * 3 * hidden_share + 2 * hidden_share
        qk = 2 * (self.heads_per_rank(tp) + self.kv_heads_per_rank(tp)) * self.head_dim
        mlp = (2 if self.gated_mlp else 1) * self.ffn / tp * self._mlps_per_token()
        return tokens * (residual_stream + qk + mlp)

    def head_flops(self, tokens: int, tp: int) -> float:
        """The output projection (LM head or MLM decoder) for `tokens` tokens on one TP rank."""
        return 2.0 * tokens * self.hidden * self.vocab / tp


def _llama(hidden: int, layers: int, heads: int, kv: int, ffn: int, vocab: int) -> Shape:
    return Shape(hidden, layers, heads, kv, ffn, vocab)


def _gpt3(hidden: int, layers: int, heads: int) -> Shape:
    return Shape(hidden, layers, heads, heads, 4 * hidden, 50257, gated_mlp=False)


SHAPES = {
    "bert-large": Shape(1024, 24, 16, 16, 4096, 30522, gated_mlp=False, causal=False),
    "gpt3-23b": _gpt3(8192, 28, 64),
    "gpt3-46b": _gpt3(8192, 56, 64),
    "gpt3-175b": _gpt3(12288, 96, 96),
    "llama-2-7b": _llama(4096, 32, 32, 32, 11008, 32000),
    "llama-2-13b": _llama(5120, 40, 40, 40, 13824, 32000),
    "codellama-13b": _llama(5120, 40, 40, 40, 13824, 32016),
    "llama-2-70b": _llama(8192, 80, 64, 8, 28672, 32000),
    "mistral-7b": _llama(4096, 32, 32, 8, 14336, 32000),
    "llama-3-8b": _llama(4096, 32, 32, 8, 14336, 128256),
    "llama-3-70b": _llama(8192, 80, 64, 8, 28672, 128256),
    "llama-3.1-405b": _llama(16384, 126, 128, 8, 53248, 128256),
    # mistralai/Mixtral-8x7B-v0.1 config.json: 8 local experts, 2 per token
    "mixtral-8x7b": Shape(4096, 32, 32, 8, 14336, 32000, experts=8, experts_per_token=2),
}
# Same shapes under other names.
SHAPES["llama-3.1-8b"] = SHAPES["llama-3-8b"]
SHAPES["llama-3.1-70b"] = SHAPES["llama-3-70b"]
SHAPES["llama-3.3-70b"] = SHAPES["llama-3-70b"]


# Encoders (no causal mask) and gated MLPs whose activation is not SiLU, by model_type.
_ENCODERS = {"bert", "roberta", "xlm-roberta", "deberta", "deberta-v2", "electra", "distilbert"}
_GATED_GELU = {"gemma", "gemma2", "gemma3_text", "t5gemma"}


def shape_from_config(config: Any) -> Shape:
    """The shape of a Transformers config: its hidden size, layers, heads (and KV heads),
    MLP width (4 x hidden where the config has none) and vocabulary. The MLP is gated
    (three matrices) when the activation is SiLU, as in Llama, Mistral and Qwen, or for the
    Gemma family; otherwise it has two."""
    hidden = int(config.hidden_size)
    heads = int(config.num_attention_heads)
    kv = getattr(config, "num_key_value_heads", None) or heads
    ffn = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None)
    act = str(getattr(config, "hidden_act", getattr(config, "activation_function", "")))
    model_type = str(getattr(config, "model_type", ""))
    # Mixture of experts (Mixtral's num_local_experts, Qwen-MoE's num_experts with its
    # moe_intermediate_size per expert); shared experts are not modelled.
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    if experts:
        ffn = getattr(config, "moe_intermediate_size", None) or ffn
    return Shape(
        hidden=hidden,
        layers=int(config.num_hidden_layers),
        heads=heads,
        kv_heads=int(kv),
        ffn=int(ffn or 4 * hidden),
        vocab=int(config.vocab_size),
        gated_mlp=act in ("silu", "swish") or model_type in _GATED_GELU,
        causal=model_type not in _ENCODERS,
        experts=int(experts or 0),
        experts_per_token=int(getattr(config, "num_experts_per_tok", 0) or 0) if experts else 0,
    )


def find_shape(model: str) -> Shape:
    """A shape by model name, ignoring case and suffixes such as -Instruct, -hf, -v0.2."""
    key = model.lower()
    for suffix in ("-instruct-v0.2", "-instruct", "-hf"):
        key = key.removesuffix(suffix)
    if key not in SHAPES:
        raise ValueError(f"no shape for {model!r}; known: {', '.join(sorted(SHAPES))}")
    return SHAPES[key]
