"""Diffusers transformers with a ``_cp_plan`` whose pipelines are not built in
tests/support/diffusers_fixtures.py (they need text encoders from the Hub): each transformer
alone, tiny, with random weights (fixed seed), and the smallest inputs whose split sequences
divide by 2. Used by the context-parallel ranks (diffusers_cp_rank.py). Each function returns
``(model, inputs)``; ``model(**inputs)`` returns a tuple of tensors (``return_dict=False``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from diffusers import (
    ChronoEditTransformer3DModel,
    HeliosTransformer3DModel,
    LTX2VideoTransformer3DModel,
    LTXVideoTransformer3DModel,
)

Inputs = dict[str, object]


def _randn(*shape: int, g: torch.Generator) -> torch.Tensor:
    return torch.randn(*shape, generator=g)


def ltx() -> tuple[torch.nn.Module, Inputs]:
    """LTX-Video: 2 x 2 x 2 latent tokens and 4 text tokens (both split), 2 heads of 16. No
    ``encoder_attention_mask``: diffusers' Ulysses attention splits the heads of query, key
    and value but not of the mask the processor shapes per head (one device would take it)."""
    torch.manual_seed(0)
    model = LTXVideoTransformer3DModel(
        in_channels=8,
        out_channels=8,
        num_attention_heads=2,
        attention_head_dim=16,
        cross_attention_dim=32,
        num_layers=2,
        caption_channels=16,
    ).eval()
    g = torch.Generator().manual_seed(1)
    inputs = {
        "hidden_states": _randn(1, 8, 8, g=g),
        "encoder_hidden_states": _randn(1, 4, 16, g=g),
        "timestep": torch.tensor([500]),
        "encoder_attention_mask": None,
        "num_frames": 2,
        "height": 2,
        "width": 2,
        "return_dict": False,
    }
    return model, inputs


def ltx2() -> tuple[torch.nn.Module, Inputs]:
    """LTX-2 (video and audio): 2 x 2 x 2 video tokens and 4 text tokens split, 4 audio
    tokens whole on every rank; 2 heads of 16 for each modality. ``isolate_modalities=True``
    (audio-to-video and video-to-audio cross attention off): the ``_cp_plan`` splits the
    video self-attention rotary embedding (``rope``) but not the cross-modal one
    (``cross_attn_rope``), so with the cross attention on, the split video queries meet the
    whole sequence's rotary embedding (a shape mismatch in ``apply_interleaved_rotary_emb``)."""
    torch.manual_seed(0)
    model = LTX2VideoTransformer3DModel(
        in_channels=8,
        out_channels=8,
        num_attention_heads=2,
        attention_head_dim=16,
        cross_attention_dim=32,
        audio_in_channels=4,
        audio_out_channels=4,
        audio_num_attention_heads=2,
        audio_attention_head_dim=16,
        audio_cross_attention_dim=32,
        num_layers=2,
        caption_channels=16,
    ).eval()
    g = torch.Generator().manual_seed(1)
    inputs = {
        "hidden_states": _randn(1, 8, 8, g=g),
        "audio_hidden_states": _randn(1, 4, 4, g=g),
        "encoder_hidden_states": _randn(1, 4, 16, g=g),
        "audio_encoder_hidden_states": _randn(1, 4, 16, g=g),
        "timestep": torch.tensor([500.0]),
        "encoder_attention_mask": None,
        "num_frames": 2,
        "height": 2,
        "width": 2,
        "audio_num_frames": 4,
        "isolate_modalities": True,
        "return_dict": False,
    }
    return model, inputs


def helios() -> tuple[torch.nn.Module, Inputs]:
    """Helios: 2 latent frames of 4 x 4 (8 tokens after (1, 2, 2) patches, split at every
    block's attention and feed-forward), 4 text tokens, 2 heads of 16; 40 blocks, since the
    ``_cp_plan`` names ``blocks.0`` to ``blocks.39`` (fewer fail in ``enable_parallelism``)."""
    torch.manual_seed(0)
    model = HeliosTransformer3DModel(
        num_attention_heads=2,
        attention_head_dim=16,
        in_channels=4,
        out_channels=4,
        text_dim=16,
        freq_dim=32,
        ffn_dim=64,
        num_layers=40,
        rope_dim=(4, 6, 6),
    ).eval()
    g = torch.Generator().manual_seed(1)
    inputs = {
        "hidden_states": _randn(1, 4, 2, 4, 4, g=g),
        "timestep": torch.tensor([500]),
        "encoder_hidden_states": _randn(1, 4, 16, g=g),
        "return_dict": False,
    }
    return model, inputs


def chronoedit() -> tuple[torch.nn.Module, Inputs]:
    """ChronoEdit: 2 latent frames of 4 x 4 (8 tokens after (1, 2, 2) patches, split), 4
    text tokens (not split), 2 heads of 16."""
    torch.manual_seed(0)
    model = ChronoEditTransformer3DModel(
        num_attention_heads=2,
        attention_head_dim=16,
        in_channels=4,
        out_channels=4,
        text_dim=16,
        freq_dim=32,
        ffn_dim=64,
        num_layers=2,
        rope_max_seq_len=32,
    ).eval()
    g = torch.Generator().manual_seed(1)
    inputs = {
        "hidden_states": _randn(1, 4, 2, 4, 4, g=g),
        "timestep": torch.tensor([500]),
        "encoder_hidden_states": _randn(1, 4, 16, g=g),
        "return_dict": False,
    }
    return model, inputs


MODELS: dict[str, Callable[[], tuple[torch.nn.Module, Inputs]]] = {
    "ltx": ltx,
    "ltx2": ltx2,
    "helios": helios,
    "chronoedit": chronoedit,
}
