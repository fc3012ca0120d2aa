"""Where the model comes from: a local checkpoint directory, a config.json, or a preset."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

# Llama-family shapes (public model cards' config.json figures), plus tiny ones this machine
# can run for real, which the tests use to check predictions against measurements.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny-llama": dict(
        model_type="llama",
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        vocab_size=8192,
        max_position_embeddings=4096,
    ),
    "small-llama": dict(
        model_type="llama",
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=12,
        vocab_size=32000,
        max_position_embeddings=4096,
    ),
    "llama-3.2-1b": dict(
        model_type="llama",
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        max_position_embeddings=131072,
        tie_word_embeddings=True,
        rope_theta=500000.0,
    ),
    "llama-3.1-8b": dict(
        model_type="llama",
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=128256,
        max_position_embeddings=131072,
        rope_theta=500000.0,
    ),
    "llama-2-7b": dict(
        model_type="llama",
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
        max_position_embeddings=4096,
    ),
    "llama-3.1-70b": dict(
        model_type="llama",
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        vocab_size=128256,
        max_position_embeddings=131072,
        rope_theta=500000.0,
    ),
}


def _config_from_fields(fields: dict[str, Any]) -> Any:
    """The config of ``fields["model_type"]``, built from the other fields."""
    from transformers import CONFIG_MAPPING

    fields = dict(fields)
    return CONFIG_MAPPING[fields.pop("model_type")](**fields)


def load_config(source: str) -> Any:
    """A Transformers config from a preset name, a config.json path or a checkpoint dir."""
    from transformers import AutoConfig

    if source in PRESETS:
        return _config_from_fields(PRESETS[source])
    path = Path(source)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} has no config.json: not a Transformers checkpoint")
        return AutoConfig.from_pretrained(str(path), local_files_only=True)
    if path.is_file():
        fields = json.loads(path.read_text())
        if "model_type" not in fields:
            raise ValueError(f"{path} has no 'model_type': not a Transformers config.json")
        return _config_from_fields(fields)
    raise ValueError(
        f"model {source!r} is neither a preset ({', '.join(PRESETS)}), a config.json nor a "
        "checkpoint directory"
    )


def build_model(config: Any, dtype: torch.dtype, device: str = "neuron") -> torch.nn.Module:
    """A causal LM for ``config``; call it under FakeTensorMode to allocate nothing."""
    from transformers import AutoModelForCausalLM

    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model
