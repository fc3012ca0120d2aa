"""Transformers causal-LM architecture coverage on the ``neuron`` device.

For every entry of the installed Transformers' ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` this
builds a small configuration generically from the config class's defaults (``shrink_config``:
two layers, hidden size 64, 4 heads / 2 KV heads, FFN 128, vocabulary 256, 4 experts with 2
per token, sub-configs shrunk recursively), seeds, creates the model with random weights on
the CPU (float32, eval), deep-copies it to ``neuron`` and checks:

(a) fp32 forward logits on fixed ``input_ids`` (batch 2, sequence 12):
    ``torch.allclose(neuron, cpu, atol=1e-4, rtol=1e-4)``.
(b) greedy ``generate`` of 8 new tokens with ``cache_implementation="static"``: identical
    tokens to the CPU's eager generation, twice on neuron:
    - *eager*: ``disable_compile=True``;
    - *compiled*: the default, what users get: on a neuron device a static cache makes
      Transformers compile the forward with backend "neuron" (into a cache directory fresh
      for the run). This costs a compile per architecture (measured: 8-81 s, 31 s on
      average, on 2 shared cores; about 95 min for all 185 static-cache architectures), so
      ``--compiled`` chooses the architectures it runs for (all by default).
    Only when the architecture cannot generate with a static cache on the CPU either does the
    eager check use the model's default cache (on both devices; the row says so); the compiled
    check is then not applicable (Transformers compiles only static caches).
(c) bf16 forward (the fp32 model cast with ``.to(torch.bfloat16)`` on each device) against
    CPU bf16: ``torch.allclose(neuron, cpu, atol=2e-2, rtol=2e-2)`` on the logits. bfloat16
    keeps 8 significant bits (unit roundoff 2**-8 = 3.9e-3), so an equally valid but
    different accumulation order in a two-layer model moves a logit by a few units in the
    last place; 2e-2 is about five ulps relative (torch.testing's own bf16 default is
    rtol=1.6e-2) and, since these random-init models have logits of order 0.1-1, the
    absolute part is on the same scale. A real kernel bug (wrong mask, wrong cast, lost bias)
    shows up as errors of order 1. The argmax agreement is recorded next to it.

The generic shrinking is retried in a fixed ladder of variants when the CPU reference fails
(multi-head instead of grouped KV heads, default sliding window, a longer layer prefix that
keeps every layer kind twice); the first variant whose CPU reference works is used and named
in the report. Hand-written special cases (``SPECIAL``) exist only where the defaults of the
installed Transformers cannot run at all, each with its reason.

An architecture whose CPU reference itself fails (missing optional package, needs inputs
beyond text, broken at any size) is listed apart and not counted; the failure is re-run on
the CPU with ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` to show torchneuron is not the cause. Each
architecture runs in a worker process with a time limit; a worker that hangs or crashes is
replaced.

    python benchmarks/hf_arch_coverage.py                 # all; writes docs/hf_coverage.md
    python benchmarks/hf_arch_coverage.py --only llama    # one (or a comma list)
    python benchmarks/hf_arch_coverage.py --limit 10      # the first 10 architectures
    python benchmarks/hf_arch_coverage.py --compiled none # eager generation only (minutes)
    python benchmarks/hf_arch_coverage.py --compiled llama,afmoe  # compiled only for these

``--only``/``--limit`` runs print to stdout and write a report only with ``--report PATH``.
The last line of stdout and of the report is the share of CPU-working architectures that pass
all three checks on ``neuron`` (fp32, eager generate, bf16), then how many of those run
compiled generate the same tokens.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import gc
import inspect
import json
import os
import platform
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPORT = os.path.join(ROOT, "docs", "hf_coverage.md")
RESULT_TAG = "@@HF_COVERAGE_RESULT@@ "
STAGE_TAG = "@@HF_COVERAGE_STAGE@@ "
READY_TAG = "@@HF_COVERAGE_READY@@"

FP32_TOL = {"atol": 1e-4, "rtol": 1e-4}
BF16_TOL = {"atol": 2e-2, "rtol": 2e-2}
BATCH, SEQ, NEW_TOKENS = 2, 12, 8
VOCAB = 256
HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 64, 4, 2, 16
INTERMEDIATE, MOE_INTERMEDIATE = 128, 32
LAYERS = 2
MAX_PREFIX_LAYERS = 12
PAD, BOS, EOS = 0, 1, 2
INPUT_LOW, INPUT_HIGH = 3, 240  # input ids avoid special tokens (<3) and remapped ids (>=240)
MIN_POSITIONS = 256
SLIDING = 8  # smaller than the prompt, so forward and generation both cross the window

# ------------------------------------------------------------------------------------------
# Generic configuration shrinking
# ------------------------------------------------------------------------------------------

LAYER_KEYS = (
    "num_hidden_layers",
    "n_layer",
    "n_layers",
    "num_layers",
    "num_blocks",
    "decoder_layers",
    "encoder_layers",
    "num_decoder_layers",
    "num_encoder_layers",
)
# attribute -> small value, applied when the default has the attribute with an int value
SIZE_RULES: dict[str, int] = {
    # width
    "hidden_size": HIDDEN,
    "n_embd": HIDDEN,
    "n_embed": HIDDEN,
    "d_model": HIDDEN,
    "embed_dim": HIDDEN,
    "embedding_dim": HIDDEN,
    "dim": HIDDEN,
    "embedding_size": HIDDEN,
    "word_embed_proj_dim": HIDDEN,
    # heads
    "num_attention_heads": HEADS,
    "n_head": HEADS,
    "n_heads": HEADS,
    "num_heads": HEADS,
    "attention_heads": HEADS,
    "decoder_attention_heads": HEADS,
    "encoder_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "num_kv_heads": KV_HEADS,
    "n_kv_heads": KV_HEADS,
    "kv_n_heads": KV_HEADS,
    "multi_query_group_num": KV_HEADS,
    "head_dim": HEAD_DIM,
    "attention_head_dim": HEAD_DIM,
    "kv_channels": HEAD_DIM,
    "d_kv": HEAD_DIM,
    "d_head": HEAD_DIM,
    # feed-forward (128 = 2 x hidden, also the SSM inner width for expand=2)
    "intermediate_size": INTERMEDIATE,
    "ffn_dim": INTERMEDIATE,
    "n_inner": INTERMEDIATE,
    "d_ff": INTERMEDIATE,
    "d_inner": INTERMEDIATE,
    "dff": INTERMEDIATE,
    "decoder_ffn_dim": INTERMEDIATE,
    "encoder_ffn_dim": INTERMEDIATE,
    "ffn_hidden_size": INTERMEDIATE,
    "inner_hidden_size": INTERMEDIATE,
    "mamba_d_ssm": INTERMEDIATE,
    "moe_intermediate_size": MOE_INTERMEDIATE,
    "shared_expert_intermediate_size": MOE_INTERMEDIATE,
    "expert_intermediate_size": MOE_INTERMEDIATE,
    "moe_ffn_hidden_size": MOE_INTERMEDIATE,
    # mixture of experts
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "moe_num_experts": 4,
    "num_experts_per_tok": 2,
    "num_experts_per_token": 2,
    "moe_topk": 2,
    "moe_k": 2,
    "top_k": 2,
    "n_group": 1,
    "num_expert_group": 1,
    "topk_group": 1,
    "n_shared_experts": 1,
    "num_shared_experts": 1,
    "first_k_dense_replace": 1,
    "num_dense_layers": 1,
    "num_kv_shared_layers": 0,
    # multi-head latent attention (head_dim then follows the class's own rule)
    "q_lora_rank": 32,
    "kv_lora_rank": 32,
    "qk_rope_head_dim": HEAD_DIM,
    "qk_nope_head_dim": HEAD_DIM,
    "v_head_dim": HEAD_DIM,
    # state-space / linear attention
    "state_size": 16,
    "ssm_state_size": 16,
    "mamba_d_state": 16,
    "d_state": 16,
    "mamba_n_heads": 4,
    "mamba_num_heads": 4,
    "mamba_d_head": 32,
    "mamba_head_dim": 32,
    "mamba_n_groups": 1,
    "n_groups": 1,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": HEAD_DIM,
    "linear_value_head_dim": HEAD_DIM,
    # rotary
    "rotary_dim": HEAD_DIM // 2,
    # vocabulary
    "vocab_size": VOCAB,
}
# None by default in some classes but required by the model: filled in
FILL_NONE = {"head_dim", "num_key_value_heads"}
# ... and in MoE configs (those with an int moe_intermediate_size), the expert counts
MOE_FILL_NONE = {
    "n_routed_experts",
    "num_local_experts",
    "num_experts",
    "num_experts_per_tok",
    "n_shared_experts",
}
POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len")
SLIDING_KEYS = ("sliding_window",)

# Variants, tried in order until the CPU reference works: name -> (MHA, keep sliding, prefix)
VARIANTS = (
    ("generic", False, False, False),
    ("generic+mha", True, False, False),
    ("generic+default-window", False, True, False),
    ("generic+layer-prefix", False, False, True),
    ("generic+mha+default-window+layer-prefix", True, True, True),
)

# Hand-written special cases: model_type -> (config overrides, reason). Only where the
# installed Transformers' defaults cannot run at all (fields a checkpoint always sets).
SPECIAL: dict[str, tuple[dict, str]] = {
    "bamba": (
        {"attn_layer_indices": [1]},
        "default config has no attention layer (attn_layer_indices=None), which Transformers' "
        "cache cannot handle; one attention layer added",
    ),
    "granitemoehybrid": (
        {"layer_types": ["mamba", "attention"]},
        "default config is all-Mamba (layer_types=None), which Transformers' cache cannot "
        "handle; one attention layer added",
    ),
    "lfm2_moe": (
        {"layer_types": ["conv", "full_attention"]},
        "default layer_types=None, which the model indexes; one conv and one attention layer",
    ),
    "qwen4_exp_text": (
        {
            "indexer_n_heads": 2,
            "indexer_kv_heads": 1,
            "indexer_head_dim": HEAD_DIM,
            "indexer_budget": 8,
            "indexer_compress_ratio": 2,
        },
        "indexer sizes default to None, which the model divides",
    ),
    "cohere_compass_text": (
        {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
        "default rope_parameters is empty, the model looks up a per-layer-type entry",
    ),
    "dbrx": (
        {"attn_config": {"rope_theta": 10000.0, "clip_qkv": 8.0}},
        "DbrxAttentionConfig has no default rope_theta (the model reads it) and its default "
        "clip_qkv=None makes the model call clamp(min=None, max=None); DBRX's value is 8",
    ),
    "gemma4_assistant": (
        {"text_config": {"hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": 0}},
        "default config fails its own validator (per-layer inputs must be off: "
        "hidden_size_per_layer_input and vocab_size_per_layer_input must be 0)",
    ),
}
SPECIAL["xlstm"] = (
    {"hidden_size": 2 * HIDDEN, "embedding_dim": 2 * HIDDEN},
    "at hidden size 64 the model's own recurrent step builds a wrongly shaped state on the "
    "CPU (ValueError: matC_old has wrong shape); 128 works",
)
SPECIAL["reformer"] = (
    {"axial_pos_embds_dim": [HIDDEN // 2, HIDDEN // 2]},
    "the axial position embedding widths must sum to the hidden size (default 64+192 for 256)",
)
SPECIAL["dots3_note_text"] = (
    {"head_dim": 2 * HEAD_DIM},
    "its validator wants head_dim = qk_nope_head_dim + qk_rope_head_dim (16 + 16)",
)
SPECIAL["dots3_note"] = (
    {"text_config": SPECIAL["dots3_note_text"][0]},
    SPECIAL["dots3_note_text"][1],
)
SPECIAL["qwen4_exp"] = ({"text_config": SPECIAL["qwen4_exp_text"][0]}, SPECIAL["qwen4_exp_text"][1])


def _passable(config_cls, default, key: str) -> bool:
    """True when `key` can be given to the config class's constructor."""
    if key in vars(default) or key in (getattr(config_cls, "attribute_map", None) or {}):
        return True
    if dataclasses.is_dataclass(config_cls):
        return key in {f.name for f in dataclasses.fields(config_cls)}
    return False


def _get(config, key: str):
    """config.key, or None; the stored global value where heterogeneous configs raise."""
    try:
        return getattr(config, key, None)
    except Exception:  # noqa: BLE001
        return vars(config).get(key)  # the global value of a per-layer attribute


def _declared_default(config_cls, key: str):
    """The default the class declares for `key` (before __post_init__ derives anything)."""
    if dataclasses.is_dataclass(config_cls):
        for f in dataclasses.fields(config_cls):
            if f.name == key:
                if f.default is not dataclasses.MISSING:
                    return f.default
                return _MISSING
    try:
        param = inspect.signature(config_cls.__init__).parameters.get(key)
    except (TypeError, ValueError):
        param = None
    if param is not None and param.default is not inspect.Parameter.empty:
        return param.default
    return _MISSING


_MISSING = object()


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _sub_config_keys(config_cls, default) -> dict:
    from transformers import PretrainedConfig

    subs = dict(getattr(config_cls, "sub_configs", None) or {})
    for key, value in vars(default).items():
        if isinstance(value, PretrainedConfig) and not key.startswith("_"):
            subs.setdefault(key, type(value))
    return subs


KV_KEYS = ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "kv_n_heads")
TOPK_KEYS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_k", "top_k")


def _small_value(key: str, value, variant: tuple):
    """SIZE_RULES applied to one (key, int value)."""
    _, mha, keep_window, _ = variant
    if key in SLIDING_KEYS and _int(value) and not keep_window:
        return min(value, SLIDING)
    if key not in SIZE_RULES or not _int(value):
        return value
    small = SIZE_RULES[key]
    if mha and key in KV_KEYS:
        return HEADS
    if key in TOPK_KEYS or key in ("n_shared_experts", "num_shared_experts"):
        return min(value, small)
    return small


def _layer_plan(config_cls, default, subs: dict, variant: tuple) -> tuple[dict, list[str]]:
    """Overrides for the layer count and every per-layer list."""
    out: dict = {}
    notes: list[str] = []
    n_layers = None
    for key in LAYER_KEYS:
        value = _get(default, key)
        if _int(value) and value > 0:
            n_layers = value
            break
    if not n_layers:
        return out, notes
    # per-layer lists: settable ones (attributes) and derived ones (properties such as
    # layer_types computed from periods); both decide which layer kinds must be kept
    settable, derived = {}, []
    for key, value in vars(default).items():
        if key.startswith("_") or key in subs:
            continue
        if isinstance(value, (list, tuple)) and len(value) == n_layers and n_layers > 1:
            settable[key] = list(value)
    for key in ("layer_types", "layers_block_type", "block_types"):
        value = _get(default, key)
        if isinstance(value, (list, tuple)) and len(value) == n_layers and key not in settable:
            derived.append(list(value))
    lists = list(settable.values()) + derived
    # heterogeneous configs: per-layer overrides are a layer kind too
    spec = _get(default, "_heterogeneity_spec")
    per_layer = dict(getattr(spec, "per_layer_overrides", None) or {})
    if per_layer:
        lists.append([_kind(per_layer.get(i, {})) for i in range(n_layers)])
    prefix = variant[3]
    first: list[int] = []
    for values in lists:
        seen: set[str] = set()
        for i, v in enumerate(values):
            if _kind(v) not in seen:
                seen.add(_kind(v))
                first.append(i)
    first = sorted(set(first))
    if prefix or derived:
        # a prefix of the default layer stack holding every layer kind (twice with `prefix`)
        need = 2 if prefix else 1
        count = min(LAYERS, n_layers)
        for values in lists:
            total: dict[str, int] = {}
            for v in values:
                total[_kind(v)] = total.get(_kind(v), 0) + 1
            counts: dict[str, int] = {}
            for i, v in enumerate(values):
                counts[_kind(v)] = counts.get(_kind(v), 0) + 1
                if all(counts.get(k, 0) >= min(need, n) for k, n in total.items()):
                    count = max(count, i + 1)
                    break
        count = min(count, MAX_PREFIX_LAYERS, n_layers)
        keep = list(range(count))
        notes.append(f"layer prefix {count}")
    else:
        keep = first[:]
        for i in range(n_layers):
            if len(keep) >= LAYERS:
                break
            if i not in keep:
                keep.append(i)
        keep = sorted(keep)
        if keep != list(range(len(keep))):
            notes.append(f"layers {keep} of {n_layers}")
    for key, values in settable.items():
        out[key] = [values[i] for i in keep]
    if per_layer:
        out["per_layer_config"] = {
            new: {k: _small_value(k, v, variant) for k, v in per_layer[old].items()}
            for new, old in enumerate(keep)
            if old in per_layer
        }
    for key in LAYER_KEYS:
        value = _get(default, key)
        if _int(value) and value > 0 and _passable(config_cls, default, key):
            # the main stack as planned; other stacks (e.g. an encoder) just small
            out[key] = len(keep) if value == n_layers else min(value, LAYERS)
    # lists of layer indices (e.g. mlp_only_layers): renumbered into the kept layers
    for key, value in vars(default).items():
        if (
            key.endswith(("_layers", "_layer_ids", "_layer_indices"))
            and key not in LAYER_KEYS
            and key not in out
            and isinstance(value, list)
            and value
            and all(_int(v) for v in value)
        ):
            out[key] = [keep.index(v) for v in value if v in keep]
    return out, notes


def shrink_overrides(
    config_cls, default, variant: tuple, tied: frozenset = frozenset()
) -> tuple[dict, list[str]]:
    """Keyword overrides that make `default` (an instance of `config_cls`) small.

    `tied`: hidden sizes of the enclosing configs (a sub-config width equal to one of them,
    such as an adapter projecting into the text model, follows the new hidden size).
    """
    _, mha, keep_window, prefix = variant
    subs = _sub_config_keys(config_cls, default)
    out, notes = _layer_plan(config_cls, default, subs, variant)
    is_moe = _int(_get(default, "moe_intermediate_size"))
    is_ssm_heads = (
        _int(_get(default, "expand"))
        and _int(_get(default, "num_heads"))
        and _get(default, "num_attention_heads") is None
    )
    for key, small in SIZE_RULES.items():
        if key in out or not _passable(config_cls, default, key):
            continue
        value = _get(default, key)
        if value is None and (key in FILL_NONE or (is_moe and key in MOE_FILL_NONE)):
            value = small  # required by the model, set by every checkpoint
        elif _declared_default(config_cls, key) is None:
            continue  # derived by the class from the sizes we set (e.g. head_dim = hidden/heads)
        if not _int(value):
            continue
        if key == "head_dim" and is_ssm_heads:
            small = default.expand * HIDDEN // HEADS  # Mamba2: heads x head_dim = expand x hidden
        if mha and key in ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "kv_n_heads"):
            small = HEADS
        if key in ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_k", "top_k"):
            small = min(value, small)
        if key in ("n_shared_experts", "num_shared_experts", "first_k_dense_replace"):
            small = min(value, small)
        if key == "num_dense_layers":
            small = min(value, small)
        out[key] = small
    shared = out.get("num_kv_shared_layers")
    if shared is not None and shared != default.num_kv_shared_layers:
        notes.append("no KV-shared layers")
    # widths tied to the hidden size (same default value, e.g. an adapter's input width)
    hidden_defaults = set(tied) | {
        _get(default, k) for k in ("hidden_size", "n_embd", "d_model") if _int(_get(default, k))
    }
    for key in sorted(vars(default)):
        value = _get(default, key)
        if (
            key not in out
            and key.endswith(("_dim", "_size"))
            and _int(value)
            and value in hidden_defaults
            and _declared_default(config_cls, key) is not None
        ):
            out[key] = HIDDEN
    # other vocabulary-sized fields (unpadded heads, per-layer input vocabularies)
    for key in sorted(vars(default)):
        value = _get(default, key)
        if "vocab_size" in key and key not in out and _int(value) and value > VOCAB:
            if _declared_default(config_cls, key) is not None:
                out[key] = VOCAB
    for key in POSITION_KEYS:
        if _int(_get(default, key)) and _passable(config_cls, default, key):
            out[key] = MIN_POSITIONS
    if not keep_window:
        for key in SLIDING_KEYS:
            value = _get(default, key)
            if _int(value) and value > SLIDING and _passable(config_cls, default, key):
                out[key] = SLIDING
    if "is_decoder" in vars(default):
        out["is_decoder"] = True
    # special token ids inside the small vocabulary
    spare = VOCAB - 1
    for key in sorted(vars(default)):
        if not key.endswith(("_token_id", "_token_index", "_token_ids")):
            continue
        value = _get(default, key)
        if key == "pad_token_id":
            out[key] = PAD
        elif key in ("bos_token_id", "decoder_start_token_id"):
            out[key] = BOS
        elif key == "eos_token_id":
            out[key] = EOS
        elif _int(value) and value >= INPUT_HIGH:
            out[key] = spare
            spare -= 1
        elif isinstance(value, list) and any(_int(v) and v >= INPUT_HIGH for v in value):
            out[key] = list(range(spare, spare - len(value), -1))
            spare -= len(value)
    # multimodal rotary sections follow the head size
    for rope_key in ("rope_parameters", "rope_scaling"):
        rope = vars(default).get(rope_key)
        if not isinstance(rope, dict) or rope_key in out:
            continue
        rope = copy.deepcopy(rope)
        changed = False
        for params in [rope] + [v for v in rope.values() if isinstance(v, dict)]:
            for section_key in ("mrope_section", "mrope_sections"):
                section = params.get(section_key)
                if isinstance(section, list) and section and all(_int(s) for s in section):
                    half = HEAD_DIM // 2
                    total = sum(section)
                    scaled = [max(1, s * half // total) for s in section]
                    scaled[0] += half - sum(scaled)
                    params[section_key] = scaled
                    changed = True
        if changed:
            out[rope_key] = rope
            notes.append("mrope section rescaled")
    # sub-configs, recursively
    from transformers import PretrainedConfig

    tied_sub = set(hidden_defaults)
    text_hidden = _get(_get(default, "text_config"), "hidden_size")
    if _int(text_hidden):
        tied_sub.add(text_hidden)
    tied_sub = frozenset(tied_sub)
    for key in subs:
        value = _get(default, key)
        if isinstance(value, PretrainedConfig):
            sub_over, sub_notes = shrink_overrides(type(value), value, variant, tied_sub)
            merged = value.to_dict()
            merged.update(sub_over)
            merged = {
                k: (v.to_dict() if isinstance(v, PretrainedConfig) else v)
                for k, v in merged.items()
            }
            out[key] = merged
            notes += [f"{key}: {n}" for n in sub_notes]
    return out, notes


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key != "rope_parameters":
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def shrink_config(model_type: str, variant: tuple = VARIANTS[0]):
    """(small config, notes) for `model_type`, built from its config class's defaults."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config_cls = CONFIG_MAPPING[model_type]
    try:
        default = config_cls()
    except Exception:
        if model_type not in SPECIAL:
            raise
        default = config_cls(**SPECIAL[model_type][0])
    overrides, notes = shrink_overrides(config_cls, default, variant)
    if model_type in SPECIAL:
        overrides = _merge(overrides, SPECIAL[model_type][0])
        notes.append("special case: " + SPECIAL[model_type][1])
    return config_cls(**overrides), notes


# ------------------------------------------------------------------------------------------
# One architecture (runs in a worker process)
# ------------------------------------------------------------------------------------------


def _stage(name: str, stage: str) -> None:
    print(f"{STAGE_TAG}{name} {stage}", flush=True)


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().replace("\n", " ")
    text = " ".join(text.split())
    return text[:400]


def _where(exc: BaseException) -> str:
    """file:line of the innermost frame inside transformers/torch (for the report)."""
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        if "site-packages" in frame.filename:
            path = frame.filename.split("site-packages/")[-1]
            return f"{path}:{frame.lineno}"
    return ""


def _logits(output):
    import torch

    value = getattr(output, "logits", None)
    if value is None:
        value = output[0]
    if isinstance(value, (list, tuple)):
        value = torch.cat([v.reshape(-1) for v in value])
    return value


def _inputs(model_type: str, config, device: str):
    import torch

    rows = BATCH
    codebooks = _get(getattr(config, "decoder", config), "num_codebooks")
    if model_type.startswith("musicgen") and _int(codebooks):
        rows = BATCH * codebooks  # MusicgenForCausalLM takes (batch x codebooks, seq)
    g = torch.Generator().manual_seed(1234)
    ids = torch.randint(INPUT_LOW, INPUT_HIGH, (rows, SEQ), generator=g)
    return ids.to(device)


def _build_model(model_type: str, config):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    torch.manual_seed(0)
    class_name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
    if model_type.startswith("musicgen"):
        model = getattr(transformers, class_name)(config.decoder)
    else:
        try:
            model = AutoModelForCausalLM.from_config(config)
        except Exception:
            model = getattr(transformers, class_name)(config)
    model = model.float().eval()
    if model_type.startswith("musicgen") and model.generation_config.decoder_start_token_id is None:
        model.generation_config.decoder_start_token_id = BOS  # MusicGen pads with it
    if model_type == "xmod":
        model.set_default_language("en_XX")  # X-MOD needs a language adapter chosen
    return model


def _forward(model, ids):
    import torch

    with torch.no_grad():
        return _logits(model(input_ids=ids)).detach()


def _generate(model, ids, static: bool, compile_path: bool):
    import torch

    kwargs = {
        "attention_mask": torch.ones_like(ids),
        "max_new_tokens": NEW_TOKENS,
        "min_new_tokens": NEW_TOKENS,
        "do_sample": False,
        "num_beams": 1,
        "num_return_sequences": 1,
        "pad_token_id": PAD,
    }
    if static:
        kwargs["cache_implementation"] = "static"
    if not compile_path:
        kwargs["disable_compile"] = True
    with torch.no_grad():
        out = model.generate(ids, **kwargs)
    if not isinstance(out, torch.Tensor):
        out = out.sequences
    return out.detach()


def _cpu_reference(model_type: str, name: str, variant: tuple) -> dict:
    """Builds the model for `variant` and runs the three CPU references."""
    import torch

    ref: dict = {"variant": variant[0], "notes": [], "errors": {}}
    _stage(name, f"config {variant[0]}")
    try:
        config, notes = shrink_config(model_type, variant)
        ref["notes"] = notes
        model = _build_model(model_type, config)
    except Exception as exc:  # noqa: BLE001
        ref["errors"]["build"] = _short(exc) + f" [{_where(exc)}]"
        return ref
    ref["model"] = model
    ref["config"] = config
    ref["params"] = sum(p.numel() for p in model.parameters())
    ids = _inputs(model_type, config, "cpu")
    ref["ids"] = ids
    _stage(name, "cpu fp32 forward")
    try:
        ref["fp32"] = _forward(model, ids)
    except Exception as exc:  # noqa: BLE001
        ref["errors"]["fp32"] = _short(exc) + f" [{_where(exc)}]"
        return ref
    _stage(name, "cpu generate")
    try:
        ref["generate"] = _generate(model, ids, static=True, compile_path=False)
        ref["static"] = True
    except Exception as exc:  # noqa: BLE001
        ref["static_error"] = _short(exc) + f" [{_where(exc)}]"
        try:
            ref["generate"] = _generate(model, ids, static=False, compile_path=False)
            ref["static"] = False
        except Exception as exc2:  # noqa: BLE001
            ref["errors"]["generate"] = (
                f"static: {ref['static_error']}; default cache: {_short(exc2)} [{_where(exc2)}]"
            )
    _stage(name, "cpu bf16 forward")
    try:
        bf16 = copy.deepcopy(model).to(torch.bfloat16)
        ref["bf16"] = _forward(bf16, ids)
        del bf16
    except Exception as exc:  # noqa: BLE001
        ref["errors"]["bf16"] = _short(exc) + f" [{_where(exc)}]"
    return ref


def _compare(got, expected, tol: dict) -> dict:
    import torch

    got = got.detach().cpu()
    if got.shape != expected.shape:
        return {"ok": False, "reason": f"shape {tuple(got.shape)} != {tuple(expected.shape)}"}
    g, e = got.float(), expected.float()
    finite = bool(torch.isfinite(g).all()) or bool((torch.isfinite(g) == torch.isfinite(e)).all())
    diff = (g - e).abs().nan_to_num(nan=float("inf"))
    max_diff = float(diff.max()) if diff.numel() else 0.0
    ok = finite and bool(torch.allclose(g, e, equal_nan=True, **tol))
    agree = 1.0
    if g.dim() >= 2 and g.shape[-1] > 1:
        agree = float((g.argmax(-1) == e.argmax(-1)).float().mean())
    res = {"ok": ok, "max_abs_diff": max_diff, "argmax_agree": agree}
    if not ok:
        scale = float(e.abs().max()) if e.numel() else 0.0
        res["reason"] = (
            f"max |diff| {max_diff:.3g} (|cpu| max {scale:.3g}), argmax agreement {agree:.1%}"
        )
    return res


def _same_tokens(got, expected) -> dict:
    import torch

    if got.device.type != "neuron":
        return {"ok": False, "reason": f"output on {got.device}"}
    got = got.cpu()
    if got.shape == expected.shape and torch.equal(got, expected):
        return {"ok": True}
    return {
        "ok": False,
        "reason": f"tokens differ: neuron {got[:, SEQ:].tolist()} cpu {expected[:, SEQ:].tolist()}",
    }


def _compiled_generate_check(dev, dev_ids, expected) -> dict:
    """Generation the default way (Transformers compiles a static cache's forward on neuron)."""
    import torch

    torch._dynamo.reset()
    torch.neuron.reset_dynamo_metrics()
    got = _generate(dev, dev_ids, static=True, compile_path=True)
    check = _same_tokens(got, expected)
    check["graphs"] = torch.neuron.get_dynamo_metrics()["host_graphs"]
    if check["ok"] and not check["graphs"]:
        check["reason"] = "Transformers did not compile"
    return check


def run_architecture(model_type: str, compiled: bool, cpu_only: bool) -> dict:
    """Everything for one architecture; returns a JSON-able result."""
    import torch

    t0 = time.time()
    result: dict = {"arch": model_type, "cpu_ok": False}
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    result["class"] = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
    # CPU reference, through the variant ladder: the first variant whose three CPU
    # references run with a static cache; else the first that runs with the default cache;
    # else (not counted) the one with the fewest CPU failures
    ref = None
    fallback = None
    attempts = []
    for variant in VARIANTS:
        candidate = _cpu_reference(model_type, model_type, variant)
        attempts.append((variant[0], dict(candidate["errors"])))
        if not candidate["errors"] and candidate.get("static"):
            ref = candidate
            break
        if not candidate["errors"]:
            fallback = fallback or candidate
        elif fallback is None and (ref is None or len(candidate["errors"]) < len(ref["errors"])):
            ref = candidate
    if ref is None or ref["errors"]:
        ref = fallback or ref
    result["variant"] = ref["variant"]
    result["notes"] = ref["notes"]
    result["params"] = ref.get("params")
    result["cpu_errors"] = ref["errors"]
    if ref["errors"]:
        result["cpu_attempts"] = attempts
    result["cpu_ok"] = not ref["errors"]
    result["static"] = ref.get("static")
    if "static_error" in ref:
        result["static_error"] = ref["static_error"]
    if cpu_only or "model" not in ref:
        result["seconds"] = round(time.time() - t0, 1)
        return result
    model, ids = ref["model"], ref["ids"]
    checks: dict = {}
    # (a) fp32 forward
    _stage(model_type, "neuron copy")
    try:
        dev = copy.deepcopy(model).to("neuron")
    except Exception as exc:  # noqa: BLE001
        reason = "model.to('neuron'): " + _short(exc) + f" [{_where(exc)}]"
        keys = ["fp32", "generate", "bf16"]
        if compiled and ref.get("static"):
            keys.append("compiled")
        result["checks"] = {k: {"ok": False, "reason": reason} for k in keys}
        result["seconds"] = round(time.time() - t0, 1)
        return result
    dev_ids = ids.to("neuron")
    if "fp32" in ref:
        _stage(model_type, "neuron fp32 forward")
        try:
            checks["fp32"] = _compare(_forward(dev, dev_ids), ref["fp32"], FP32_TOL)
        except Exception as exc:  # noqa: BLE001
            checks["fp32"] = {"ok": False, "reason": _short(exc) + f" [{_where(exc)}]"}
    # (b) greedy generate, same cache kind as the CPU reference
    if "generate" in ref:
        _stage(model_type, "neuron generate")
        try:
            got = _generate(dev, dev_ids, static=ref["static"], compile_path=False)
            checks["generate"] = _same_tokens(got, ref["generate"])
        except Exception as exc:  # noqa: BLE001
            checks["generate"] = {"ok": False, "reason": _short(exc) + f" [{_where(exc)}]"}
    # (b') the same, the default way: compiled (before bf16, which casts `dev` in place)
    if "generate" in ref and compiled and ref.get("static"):
        _stage(model_type, "neuron compiled generate")
        try:
            checks["compiled"] = _compiled_generate_check(dev, dev_ids, ref["generate"])
        except Exception as exc:  # noqa: BLE001
            checks["compiled"] = {"ok": False, "reason": _short(exc) + f" [{_where(exc)}]"}
    # (c) bf16 forward: the neuron model cast on the device
    if "bf16" in ref:
        _stage(model_type, "neuron bf16 forward")
        try:
            dev = dev.to(torch.bfloat16)
            checks["bf16"] = _compare(_forward(dev, dev_ids), ref["bf16"], BF16_TOL)
        except Exception as exc:  # noqa: BLE001
            checks["bf16"] = {"ok": False, "reason": _short(exc) + f" [{_where(exc)}]"}
    result["checks"] = checks
    result["seconds"] = round(time.time() - t0, 1)
    del dev, model, ref
    return result


def worker_main(args) -> None:
    """Reads architecture names on stdin, prints one tagged JSON result per name."""
    for attempt in range(30):
        try:
            import torch
            import transformers  # noqa: F401

            if not args.cpu_only:
                torch.empty(1, device="neuron")
            break
        except Exception:  # noqa: BLE001
            # another engineer may be rebuilding the extension: wait and retry
            if attempt == 29:
                raise
            time.sleep(10)
    import torch

    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    print(READY_TAG, flush=True)
    for line in sys.stdin:
        name, _, compiled = line.strip().partition(" ")
        if not name:
            continue
        try:
            result = run_architecture(name, compiled == "compiled", args.cpu_only)
        except Exception as exc:  # noqa: BLE001
            result = {"arch": name, "cpu_ok": False, "cpu_errors": {"harness": _short(exc)}}
        try:
            import torch._dynamo

            torch._dynamo.reset()
        except Exception:  # noqa: BLE001
            pass
        gc.collect()
        print(RESULT_TAG + json.dumps(result, default=str), flush=True)


# ------------------------------------------------------------------------------------------
# Parent: workers with time limits, report
# ------------------------------------------------------------------------------------------


class Worker:
    """A worker process fed one architecture at a time."""

    def __init__(self, args, cpu_only: bool, log_dir: str) -> None:
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--worker",
            "--threads",
            str(args.threads),
        ]
        env = dict(os.environ)
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "1"
        if cpu_only:
            cmd.append("--cpu-only")
            env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        env.setdefault("HF_HUB_OFFLINE", "1")
        env["PYTHONUNBUFFERED"] = "1"
        self.log_path = os.path.join(log_dir, f"worker-{time.time_ns()}.log")
        self.log = open(self.log_path, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=env,
            cwd=ROOT,
        )
        self.lines: queue.Queue = queue.Queue()
        self.stage = "starting"
        threading.Thread(target=self._read, daemon=True).start()
        self.served = 0

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, tag: str, timeout: float):
        """The payload after `tag`, or None on timeout / exit."""
        deadline = time.time() + timeout
        while True:
            remaining = deadline - time.time()
            if remaining <= 0:
                return "timeout"
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                return "timeout"
            if line is None:
                return "exit"
            if line.startswith(STAGE_TAG):
                self.stage = line[len(STAGE_TAG) :].strip()
            elif line.startswith(tag):
                return line[len(tag) :]

    def submit(self, name: str, compiled: bool) -> None:
        self.stage = f"{name} queued"
        self.proc.stdin.write(name + (" compiled" if compiled else "") + "\n")
        self.proc.stdin.flush()
        self.served += 1

    def stderr_tail(self, n: int = 6) -> str:
        self.log.flush()
        try:
            with open(self.log_path) as f:
                lines = [ln.rstrip() for ln in f if ln.strip()]
        except OSError:
            return ""
        return " | ".join(lines[-n:])[-600:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class Runner:
    def __init__(self, args, cpu_only: bool, log_dir: str) -> None:
        self.args, self.cpu_only, self.log_dir = args, cpu_only, log_dir
        self.worker: Worker | None = None

    def _ensure(self) -> Worker:
        if self.worker is not None and self.worker.served >= self.args.recycle:
            self.worker.stop()
            self.worker = None
        while self.worker is None:
            w = Worker(self.args, self.cpu_only, self.log_dir)
            if w.wait_for(READY_TAG, 600) is not None and w.proc.poll() is None:
                self.worker = w
            else:
                tail = w.stderr_tail()
                w.kill()
                print(f"[coverage] worker failed to start ({tail}); retrying in 30 s", flush=True)
                time.sleep(30)
        return self.worker

    def run(self, name: str, compiled: bool = False) -> dict:
        timeout = self.args.timeout + (self.args.compile_timeout if compiled else 0.0)
        for attempt in range(2):
            w = self._ensure()
            w.submit(name, compiled)
            payload = w.wait_for(RESULT_TAG, timeout)
            if payload not in ("timeout", "exit", None):
                return json.loads(payload)
            stage = w.stage
            if payload == "timeout":
                w.kill()
                self.worker = None
                return {
                    "arch": name,
                    "cpu_ok": None,
                    "timeout": True,
                    "harness_error": f"time limit {timeout:.0f} s hit during '{stage}'",
                }
            code = w.proc.wait()
            tail = w.stderr_tail()
            w.kill()
            self.worker = None
            if attempt == 0:
                continue  # a crash may be a rebuild of the extension under us: retry once
            return {
                "arch": name,
                "cpu_ok": None,
                "crash": True,
                "harness_error": f"worker died (exit {code}) during '{stage}': {tail}",
            }
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.worker is not None:
            self.worker.stop()


def check_cell(result: dict, key: str) -> str:
    check = (result.get("checks") or {}).get(key)
    if check is None:
        if key == "compiled":
            if result.get("static") is False:
                return "n/a (default cache)"
            return "not run" if "compiled_requested" not in result else "n/a"
        return "n/a"
    if check["ok"]:
        if key == "generate":
            return "pass" if result.get("static") else "pass (default cache)"
        if key == "compiled":
            graphs = check.get("graphs", 0)
            return f"pass ({graphs} graphs)" if graphs else "pass (**not compiled**)"
        return f"pass ({check.get('max_abs_diff', 0):.1e})"
    return "**FAIL**"


def passes_all(result: dict) -> bool:
    checks = result.get("checks") or {}
    return all((checks.get(k) or {}).get("ok") for k in ("fp32", "generate", "bf16"))


def counted(result: dict) -> bool:
    """CPU-working: all three CPU references ran (in the run, or alone without torchneuron)."""
    return any(result.get(k) for k in ("cpu_ok", "cpu_fails_only_with_neuron", "cpu_ok_alone"))


def failure_reasons(result: dict) -> dict[str, str]:
    """check -> reason, for the checks that did not pass on neuron (compiled: if run)."""
    out = {}
    for key in ("fp32", "generate", "bf16"):
        c = (result.get("checks") or {}).get(key)
        if c is None:
            out[key] = f"not run ({result.get('harness_error', 'no result')})"
        elif not c["ok"]:
            out[key] = c.get("reason", "")
    compiled = (result.get("checks") or {}).get("compiled")
    if compiled is not None and not compiled["ok"]:
        out["compiled"] = compiled.get("reason", "")
    return out


def compiled_counts(results: list[dict]) -> tuple[int, int, int, int]:
    """(run, passed, not applicable, not run) of the compiled-generation check."""
    working = [r for r in results if counted(r)]
    ran = [r for r in working if "compiled" in (r.get("checks") or {})]
    passed = [r for r in ran if r["checks"]["compiled"]["ok"]]
    not_applicable = [
        r for r in working if r.get("compiled_requested") and r.get("static") is False
    ]
    not_run = len(working) - len(ran) - len(not_applicable)
    return len(ran), len(passed), len(not_applicable), not_run


def root_cause(key: str, reason: str) -> str:
    """A grouping key: the exception text, or the kind of numerical mismatch."""
    if reason.startswith("max |diff|"):
        return f"{key} logits outside tolerance"
    if reason.startswith("tokens differ"):
        return "generated tokens differ"
    return reason.split(" [")[0]


def md_escape(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def headline(results: list[dict]) -> tuple[str, int, int]:
    working = [r for r in results if counted(r)]
    passing = [r for r in working if passes_all(r)]
    pct = 100.0 * len(passing) / len(working) if working else 0.0
    ran, passed, not_applicable, not_run = compiled_counts(results)
    line = (
        f"{pct:.1f}% of CPU-working architectures pass all three checks on neuron "
        f"({len(passing)}/{len(working)}; {len(results)} architectures in the mapping); "
        f"default compiled generation: {passed}/{ran} pass ({not_applicable} not applicable: "
        f"no static cache; {not_run} not run)"
    )
    return line, len(working), len(passing)


def write_report(path: str, results: list[dict], args, elapsed: float) -> None:
    import torch
    import transformers

    line, n_working, n_passing = headline(results)
    working = [r for r in results if counted(r)]
    apart = [r for r in results if not counted(r)]
    out: list[str] = []
    out.append("# Transformers causal-LM architecture coverage on `neuron`")
    out.append("")
    out.append(
        "Generated by `benchmarks/hf_arch_coverage.py` (do not edit by hand). "
        f"{datetime.date.today().isoformat()}, transformers {transformers.__version__}, "
        f"torch {torch.__version__}, Python {platform.python_version()}, "
        f"{elapsed / 60:.0f} min on {os.cpu_count()} cores."
    )
    out.append("")
    out.append(
        "Every entry of `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`, built from its config class's "
        f"defaults shrunk generically ({LAYERS} layers, hidden {HIDDEN}, {HEADS} heads / "
        f"{KV_HEADS} KV heads, head_dim {HEAD_DIM}, FFN {INTERMEDIATE}, vocabulary {VOCAB}, "
        f"4 experts / 2 per token, sliding window {SLIDING}, sub-configs shrunk recursively), "
        "random weights (seed 0), float32 on the CPU and a deep copy on `neuron`. Checks on "
        f"`input_ids` of shape ({BATCH}, {SEQ}):"
    )
    out.append("")
    out.append(
        f"- **fp32**: forward logits, `allclose(atol={FP32_TOL['atol']}, "
        f"rtol={FP32_TOL['rtol']})` (cell: max |diff|)."
    )
    out.append(
        f'- **generate**: greedy, {NEW_TOKENS} new tokens, `cache_implementation="static"`, '
        "identical tokens to the CPU's eager generation. Two checks on neuron: *eager* "
        "(`disable_compile=True`) and *compiled*: the default path, where Transformers "
        'compiles the forward with backend "neuron" (cell: graphs compiled; cache directory '
        "fresh for the run). *default cache* marks the architectures whose static-cache "
        "generation fails on the CPU too (reason in the notes); Transformers does not "
        "compile those. Compiled generation was run for: "
        + (
            "every CPU-working architecture with a static cache."
            if args.compiled == "all"
            else "none."
            if args.compiled == "none"
            else f"`{args.compiled}` (other rows: not run)."
        )
    )
    out.append(
        f"- **bf16**: the model cast to bfloat16 on each device, logits `allclose(atol="
        f"{BF16_TOL['atol']}, rtol={BF16_TOL['rtol']})`: bf16 keeps 8 significant bits "
        "(unit roundoff 3.9e-3), so two valid accumulation orders differ by a few ulps; 2e-2 "
        "is about five ulps on logits of order 1 (torch.testing's bf16 default rtol is "
        "1.6e-2). Kernel bugs show as errors of order 1."
    )
    out.append("")
    ran, passed, not_applicable, not_run = compiled_counts(results)
    out.append(
        f"**{len(results)} architectures; {n_working} work on the CPU; {n_passing} pass all "
        f"three checks on neuron (eager generation); {len(apart)} not counted (fail on the "
        f"CPU too). Default compiled generation: {passed} of {ran} run pass; "
        f"{not_applicable} not applicable (no static cache); {not_run} not run.**"
    )
    out.append("")
    out.append("## CPU-working architectures")
    out.append("")
    out.append(
        "| architecture | class | CPU | fp32 | generate (eager) | generate (compiled) | bf16 | "
        "config | failures |"
    )
    out.append("|---|---|---|---|---|---|---|---|---|")
    for r in working:
        reasons = failure_reasons(r)
        if len(reasons) == 3 and len(set(reasons.values())) == 1:
            fails = [f"all three: {next(iter(reasons.values()))}"]
        else:
            fails = [f"{k}: {v}" for k, v in reasons.items()]
        if r.get("cpu_fails_only_with_neuron"):
            fails.insert(
                0,
                "CPU fails with torchneuron loaded, passes without: "
                + "; ".join(f"{k}: {v}" for k, v in r["cpu_errors"].items()),
            )
        notes = [r.get("variant", "")]
        if r.get("static") is False:
            notes.append("static cache unsupported on CPU: " + r.get("static_error", "")[:160])
        cfg = "; ".join(n for n in notes if n)
        if r.get("cpu_ok"):
            cpu = "ok"
        elif r.get("cpu_ok_alone"):
            cpu = "ok (alone)"
        else:
            cpu = "**fails only with torchneuron**"
        out.append(
            f"| {r['arch']} | {r.get('class', '')} | {cpu} | {check_cell(r, 'fp32')} | "
            f"{check_cell(r, 'generate')} | {check_cell(r, 'compiled')} | "
            f"{check_cell(r, 'bf16')} | {md_escape(cfg)} | "
            f"{md_escape('; '.join(fails))} |"
        )
    out.append("")
    groups: dict[str, dict[str, list[str]]] = {}
    for r in working:
        for key, reason in failure_reasons(r).items():
            groups.setdefault(root_cause(key, reason), {}).setdefault(r["arch"], []).append(key)
    if groups:
        out.append("## neuron failures by cause")
        out.append("")
        for cause, archs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            where = ", ".join(f"{a} ({', '.join(keys)})" for a, keys in archs.items())
            out.append(f"- **{md_escape(cause)}** ({len(archs)} architectures): {where}")
        out.append("")
    out.append("## Not counted: the CPU reference fails too")
    out.append("")
    out.append(
        "Each was re-run on the CPU alone with `TORCH_DEVICE_BACKEND_AUTOLOAD=0` (torchneuron "
        "not loaded); the column says whether it fails there the same way. neuron results, "
        "where a CPU reference existed, are informative only."
    )
    out.append("")
    out.append(
        "| architecture | class | CPU failure | without torchneuron | neuron (informative) |"
    )
    out.append("|---|---|---|---|---|")
    for r in apart:
        if r.get("harness_error"):
            reason = r["harness_error"]
        else:
            reason = "; ".join(f"{k}: {v}" for k, v in (r.get("cpu_errors") or {}).items())
        confirm = r.get("cpu_only_check", "not re-run")
        checks = r.get("checks") or {}
        info = ", ".join(f"{k} {'pass' if c['ok'] else 'FAIL'}" for k, c in checks.items()) or "-"
        out.append(
            f"| {r['arch']} | {r.get('class', '')} | {md_escape(reason)} | "
            f"{md_escape(confirm)} | {info} |"
        )
    out.append("")
    out.append("## Configuration notes")
    out.append("")
    out.append(
        "The variant names the first entry of the generic ladder whose CPU reference worked "
        "(`generic`; `+mha`: KV heads = heads; `+default-window`: sliding window not shrunk; "
        "`+layer-prefix`: a prefix of the default layer stack keeping every layer kind "
        f"twice, at most {MAX_PREFIX_LAYERS} layers). Hand-written special cases:"
    )
    out.append("")
    for key, (over, reason) in sorted(SPECIAL.items()):
        out.append(f"- `{key}`: `{json.dumps(over)}`: {reason}.")
    out.append(
        "- `musicgen`, `musicgen_melody`: the causal LM is built from the `decoder` "
        "sub-config and fed (batch x num_codebooks, seq) ids, as the class expects."
    )
    out.append('- `xmod`: `model.set_default_language("en_XX")`, since X-MOD needs an adapter.')
    notes = [r for r in results if r.get("notes")]
    if notes:
        out.append("")
        out.append("Per-architecture notes from the generic shrinking:")
        out.append("")
        for r in notes:
            out.append(f"- `{r['arch']}`: {md_escape('; '.join(r['notes']))}")
    out.append("")
    out.append(line)
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def summary_line(r: dict) -> str:
    if r.get("harness_error"):
        return f"{r['arch']:28s} HARNESS  {r['harness_error'][:150]}"
    if not r.get("cpu_ok"):
        errs = "; ".join(f"{k}: {v}" for k, v in (r.get("cpu_errors") or {}).items())
        return f"{r['arch']:28s} CPU-FAIL {errs[:150]}"
    cells = " ".join(
        f"{k}={check_cell(r, k).replace('**', '')}"
        for k in ("fp32", "generate", "compiled", "bf16")
    )
    compiled_ok = (r.get("checks") or {}).get("compiled", {"ok": True})["ok"]
    status = "PASS" if passes_all(r) and compiled_ok else "FAIL"
    extra = ""
    if status == "FAIL":
        extra = " | " + "; ".join(
            f"{k}: {c.get('reason', '')[:120]}"
            for k, c in (r.get("checks") or {}).items()
            if not c["ok"]
        )
    return f"{r['arch']:28s} {status:8s} {cells} [{r.get('seconds', '?')} s]{extra}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", help="architecture name(s), comma-separated (mapping keys)")
    p.add_argument("--limit", type=int, help="only the first N architectures")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per architecture")
    p.add_argument(
        "--compile-timeout",
        type=float,
        default=900.0,
        help="extra seconds for an architecture whose generation is also compiled",
    )
    p.add_argument("--threads", type=int, default=1, help="intra-op threads per worker")
    p.add_argument("--recycle", type=int, default=20, help="architectures per worker process")
    p.add_argument(
        "--compiled",
        default="all",
        help="architectures whose generation is also run the default (compiled) way: "
        "'all' (default), 'none', or a comma list",
    )
    p.add_argument("--report", help="report path (default docs/hf_coverage.md for full runs)")
    p.add_argument("--json", help="also write the raw results as JSON here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--cpu-only", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker_main(args)
        return

    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")  # the parent needs no device
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    names = list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES]
        if unknown:
            p.error(f"not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES: {', '.join(unknown)}")
        names = wanted
    if args.limit:
        names = names[: args.limit]
    report = args.report or (REPORT if not args.only and not args.limit else None)
    if args.compiled in ("all", "none"):
        compiled = set(names) if args.compiled == "all" else set()
    else:
        compiled = {n.strip() for n in args.compiled.split(",") if n.strip()}
        unknown = sorted(compiled - set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES))
        if unknown:
            p.error(f"--compiled: not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES: {', '.join(unknown)}")

    log_dir = tempfile.mkdtemp(prefix="hf_coverage_")
    # compiled generation starts from an empty compile cache, as a new user's would
    os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"] = os.path.join(log_dir, "neff_cache")
    os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    print(f"[coverage] {len(names)} architectures; worker logs in {log_dir}", flush=True)
    start = time.time()
    results: list[dict] = []
    runner = Runner(args, cpu_only=False, log_dir=log_dir)
    try:
        for i, name in enumerate(names):
            r = runner.run(name, compiled=name in compiled)
            if name in compiled:
                r["compiled_requested"] = True
            results.append(r)
            print(f"[{i + 1:3d}/{len(names)}] {summary_line(r)}", flush=True)
    finally:
        runner.close()
        shutil.rmtree(os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"], ignore_errors=True)
    # CPU failures: confirm without torchneuron loaded
    # CPU failures, timeouts and crashes: the CPU reference alone, without torchneuron
    failing = [r for r in results if not r.get("cpu_ok")]
    if failing:
        print(f"[coverage] re-running {len(failing)} CPU failures without torchneuron", flush=True)
        cpu_runner = Runner(args, cpu_only=True, log_dir=log_dir)
        try:
            for r in failing:
                c = cpu_runner.run(r["arch"])
                if c.get("harness_error"):
                    r["cpu_only_check"] = "not confirmed: " + c["harness_error"]
                elif c.get("cpu_ok") and r.get("harness_error"):
                    # the CPU reference works: the time limit / crash is neuron's
                    r["cpu_ok_alone"] = True
                    r["cpu_only_check"] = "CPU reference alone works"
                elif c.get("cpu_ok"):
                    r["cpu_fails_only_with_neuron"] = True
                    r["cpu_only_check"] = "PASSES without torchneuron"
                else:
                    same = set(c.get("cpu_errors", {})) == set(r.get("cpu_errors", {}))
                    r["cpu_only_check"] = (
                        "fails the same way"
                        if same
                        else (
                            "fails: " + "; ".join(f"{k}: {v}" for k, v in c["cpu_errors"].items())
                        )
                    )
                print(f"    {r['arch']:28s} {r['cpu_only_check'][:120]}", flush=True)
        finally:
            cpu_runner.close()
    elapsed = time.time() - start
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    line, _, _ = headline(results)
    if report:
        write_report(report, results, args, elapsed)
        print(f"[coverage] report written to {os.path.relpath(report, os.getcwd())}", flush=True)
    print(line, flush=True)


if __name__ == "__main__":
    main()
