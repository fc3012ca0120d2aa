"""MiniMax-H3, small: its transformer with a packed-sequence input as the pipeline lays it
out, and its ``t2va`` modular pipeline (text to video and audio) with every component built
here from configs with random weights: a tiny Qwen3-VL text encoder, a byte-level tokenizer,
the video and audio VAEs and the schedulers (the Hub is not reachable). Used by
tests/test_diffusers.py and the context-parallel ranks (diffusers_cp_rank.py).
"""

from __future__ import annotations

from unittest import mock

import torch
from diffusers import (
    AutoencoderKLMiniMaxH3,
    AutoencoderKLMiniMaxH3Audio,
    MiniMaxH3Scheduler,
    MiniMaxH3Transformer3DModel,
)
from diffusers.modular_pipelines import MiniMaxH3Blocks, MiniMaxH3ModularPipeline
from transformers import (
    Qwen2TokenizerFast,
    Qwen2VLImageProcessor,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLProcessor,
)
from transformers.convert_slow_tokenizer import bytes_to_unicode


def minimax_h3_transformer() -> MiniMaxH3Transformer3DModel:
    """MiniMax-H3's transformer, tiny: 2 heads of 16 (12 channels rotated over t, h, w)."""
    torch.manual_seed(0)
    return MiniMaxH3Transformer3DModel(
        num_attention_heads=2,
        attention_head_dim=16,
        hidden_size=32,
        num_layers=2,
        num_refiner_layers=1,
        ffn_dim=64,
        in_channels=4,
        audio_in_channels=4,
        patch_size=(1, 2, 2),
        text_dim=16,
        freq_dim=32,
        time_embed_hidden_dim=32,
        time_embed_dim=16,
        rope_freq_dim=2,
    ).eval()


def minimax_h3_inputs(text: int = 4, video: int = 8, audio: int = 4) -> dict[str, torch.Tensor]:
    """One packed sequence, as the modular pipeline lays it out: text rows (at the
    conditioning timestep), then video and audio rows (at the denoising one)."""
    g = torch.Generator().manual_seed(1)
    rows = text + video + audio
    positions = torch.arange(rows)
    return {
        "hidden_states": torch.randn(1, video, 16, generator=g),
        "audio_hidden_states": torch.randn(1, audio, 4, generator=g),
        "encoder_hidden_states": torch.randn(1, text, 16, generator=g),
        "timestep": torch.tensor([0.999, 0.4]),
        "timestep_indices": (positions >= text).long(),
        "token_tags": torch.cat(
            [torch.ones(text), torch.zeros(video), torch.full((audio,), 2.0)]
        ).long(),
        "position_ids": torch.stack([positions // 4, positions % 4 // 2, positions % 2], 1),
        "text_indices": positions[:text],
        "video_indices": positions[text : text + video],
        "audio_indices": positions[text + video :],
    }


# MiniMax-H3's modular pipeline (``MiniMaxH3Blocks``, the ``t2va`` workflow: text to video and
# audio), every component tiny and built here. The pipeline generates 5 to 15 seconds at 24 fps,
# so its shortest request is 124 frames (17 * 7 + 5, the next length the video VAE decodes): 37
# latent frames and 207 audio latents per stereo channel. A 32 px canvas keeps that cheap: the
# video VAE compresses 16x, so a latent frame is one (1, 2, 2) patch row of the transformer.
MINIMAX_H3_FRAMES = 124
MINIMAX_H3_PROMPT = "a robot dancing"
MINIMAX_H3_VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]


def minimax_h3_tokenizer() -> Qwen2TokenizerFast:
    """A byte-level BPE tokenizer over the 256 byte symbols alone (no merges, so one token per
    byte), with the vision tokens Qwen3-VL's processor looks up."""
    vocab = {symbol: i for i, symbol in enumerate(bytes_to_unicode().values())}
    tokenizer = Qwen2TokenizerFast(vocab=vocab, merges=[])
    tokenizer.add_special_tokens({"additional_special_tokens": MINIMAX_H3_VISION_TOKENS})
    return tokenizer


def minimax_h3_processor(tokenizer: Qwen2TokenizerFast) -> Qwen3VLProcessor:
    """Qwen3-VL's processor with the tokenizer and an image processor, and no video processor.

    ``ProcessorMixin.__init__`` checks every argument against its base class; transformers
    exports ``BaseVideoProcessor`` only when torchvision is installed, which it is not here, so
    the check fails for any video processor, None included. It is skipped while constructing.
    The ``t2va`` text encoder step calls only ``create_mm_token_type_ids``, which reads the
    tokenizer's vision token ids.
    """
    with mock.patch.object(Qwen3VLProcessor, "check_argument_for_proper_class", lambda *a: None):
        return Qwen3VLProcessor(
            image_processor=Qwen2VLImageProcessor(), tokenizer=tokenizer, video_processor=None
        )


def minimax_h3_text_encoder(tokenizer: Qwen2TokenizerFast) -> Qwen3VLForConditionalGeneration:
    """Qwen3-VL, tiny: width 16 (the transformer's ``text_dim``) and 51 decoder layers, since
    MiniMax-H3 conditions on ``hidden_states[50]`` and refuses a shallower encoder."""
    torch.manual_seed(0)
    ids = tokenizer.convert_tokens_to_ids
    config = Qwen3VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_hidden_layers": 51,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 8,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [2, 1, 1],
                "mrope_interleaved": True,
            },
        },
        vision_config={
            "depth": 1,
            "hidden_size": 16,
            "intermediate_size": 32,
            "num_heads": 2,
            "out_hidden_size": 16,
            "patch_size": 4,
            "num_position_embeddings": 16,
            "deepstack_visual_indexes": [0],
        },
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
    )
    return Qwen3VLForConditionalGeneration(config).eval()


def minimax_h3_vae() -> AutoencoderKLMiniMaxH3:
    """The video VAE, tiny: 16x spatial and 4x temporal compression as released (17-frame
    chunks to 5 latent frames), 4 latent channels, one ViT decoder layer."""
    torch.manual_seed(0)
    return AutoencoderKLMiniMaxH3(
        latent_channels=4,
        block_out_channels=(8, 8, 8, 8),
        layers_per_block=1,
        spatial_downsample_factors=(2, 2, 2, 2),
        temporal_downsample_factors=(1, 2, 2, 1),
        norm_num_groups=4,
        decoder_num_layers=1,
        decoder_num_attention_heads=2,
        decoder_attention_head_dim=8,
        decoder_num_register_tokens=1,
        decoder_ffn_mult=2,
        latents_mean=(0.0,) * 4,
        latents_std=(1.0,) * 4,
    ).eval()


def minimax_h3_audio_vae() -> AutoencoderKLMiniMaxH3Audio:
    """The audio VAE, tiny: 4 samples per latent (released: 800), 4 latent channels."""
    torch.manual_seed(0)
    return AutoencoderKLMiniMaxH3Audio(
        encoder_dim=4,
        encoder_rates=(2, 2),
        latent_dim=8,
        latent_channels=4,
        num_attention_heads=2,
        decoder_dim=8,
        decoder_rates=(2, 2),
        decoder_kernel_sizes=(4, 4),
        resblock_kernel_sizes=(3,),
        resblock_dilation_sizes=((1,),),
        sampling_rate=160,
        latents_mean=[0.0] * 4,
        latents_std=[1.0] * 4,
    ).eval()


def build_minimax_h3() -> MiniMaxH3ModularPipeline:
    """``MiniMaxH3Blocks().init_pipeline()`` with every component of the ``t2va`` workflow: the
    tiny transformer above, Qwen3-VL text encoder, tokenizer and processor, video and audio
    VAEs, and the two schedulers with the released shifts (12 for video, 3 for audio). The
    ``ref2va`` transformer (``transformer_ref``) stays unset; ``t2va`` does not use it."""
    tokenizer = minimax_h3_tokenizer()
    pipe = MiniMaxH3Blocks().init_pipeline()
    pipe.update_components(
        text_encoder=minimax_h3_text_encoder(tokenizer),
        tokenizer=tokenizer,
        processor=minimax_h3_processor(tokenizer),
        vae=minimax_h3_vae(),
        audio_vae=minimax_h3_audio_vae(),
        scheduler=MiniMaxH3Scheduler(shift=12.0),
        audio_scheduler=MiniMaxH3Scheduler(shift=3.0),
        transformer=minimax_h3_transformer(),
    )
    return pipe


def run_minimax_h3(
    pipe: MiniMaxH3ModularPipeline,
    device: str,
    height: int = 32,
    width: int = 32,
    seed: int = 0,
    generator_device: str | None = None,
    prompt: str = MINIMAX_H3_PROMPT,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pipeline's video ``(1, 124, 3, height, width)`` and stereo audio ``(1, 2, 828)`` as
    CPU tensors, for ``seed``, on ``device`` (the pipeline is moved there).

    ``num_inference_steps=3`` is the schedule's 3 sigmas, terminal 0 included: 2 transformer
    evaluations, as the other pipelines' 2 steps. The noise is drawn from a generator on
    ``generator_device`` (default: ``device``).
    """
    pipe.to(device)
    generator = torch.Generator(generator_device or device).manual_seed(seed)
    with torch.no_grad():
        state = pipe(
            prompt=prompt,
            generator=generator,
            num_inference_steps=3,
            height=height,
            width=width,
            num_frames=MINIMAX_H3_FRAMES,
            output_type="pt",
        )
    return state.get("videos").cpu(), state.get("audio").cpu()
