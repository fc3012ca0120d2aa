"""Generic shrinking of a Transformers configuration for the architecture coverage run.

``shrink_config(model_type, variant)`` builds a small configuration of the installed
Transformers' config class from its own defaults: two layers (or a prefix of the layer stack
keeping every layer kind), hidden size 64, 4 heads / 2 KV heads, FFN 128, vocabulary 256,
4 experts with 2 per token, sub-configs shrunk recursively. ``VARIANTS`` is the ladder tried
when the CPU reference fails; ``SPECIAL`` the hand-written cases, each with its reason.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import json

VOCAB = 256
HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 64, 4, 2, 16
INTERMEDIATE, MOE_INTERMEDIATE = 128, 32
LAYERS = 2
MAX_PREFIX_LAYERS = 12
PAD, BOS, EOS = 0, 1, 2
INPUT_LOW, INPUT_HIGH = 3, 240  # input ids avoid special tokens (<3) and remapped ids (>=240)
MIN_POSITIONS = 256
SLIDING = 8  # smaller than the prompt, so forward and generation both cross the window

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
