"""Small Diffusers pipelines built from configs with random weights, for tests and examples.

Each case builds a pipeline without text encoders or tokenizers (the Hub is not reachable):
its inputs carry ``prompt_embeds`` (and pooled or negative embeddings where the pipeline needs
them), drawn from a fixed CPU seed, so a CPU run and a neuron run see the same conditioning.
Weights come from a fixed seed too, so two builds are identical. MiniMax-H3's modular
pipeline is the exception: it runs whole, text encoder included (a tiny Qwen3-VL and a
byte-level tokenizer made here, see ``build_minimax_h3``). Every pipeline runs 2
denoising steps at a small resolution; the tiny VAEs keep decoding cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch
from diffusers import (
    AutoencoderKL,
    AutoencoderKLFlux2,
    AutoencoderKLMiniMaxH3,
    AutoencoderKLMiniMaxH3Audio,
    AutoencoderKLQwenImage,
    AutoencoderKLQwenImage21,
    AutoencoderKLWan,
    DiffusionPipeline,
    EulerDiscreteScheduler,
    FlowMatchEulerDiscreteScheduler,
    Flux2KleinPipeline,
    Flux2Pipeline,
    Flux2Transformer2DModel,
    FluxPipeline,
    FluxTransformer2DModel,
    MiniMaxH3Scheduler,
    MiniMaxH3Transformer3DModel,
    QwenImage21Pipeline,
    QwenImage21Transformer2DModel,
    QwenImagePipeline,
    QwenImageTransformer2DModel,
    StableDiffusionXLPipeline,
    UNet2DConditionModel,
    WanPipeline,
    WanTransformer3DModel,
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

STEPS = 2


def _embeds(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _flow_scheduler() -> FlowMatchEulerDiscreteScheduler:
    return FlowMatchEulerDiscreteScheduler()


def flux_transformer(width: int = 32, heads: int = 2, layers: int = 1) -> FluxTransformer2DModel:
    """FLUX.1's transformer; ``width`` = heads x head dim (rope axes sum to the head dim)."""
    head_dim = width // heads
    return FluxTransformer2DModel(
        patch_size=1,
        in_channels=4,
        num_layers=layers,
        num_single_layers=layers,
        attention_head_dim=head_dim,
        num_attention_heads=heads,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        axes_dims_rope=[head_dim // 4, head_dim // 4, head_dim // 2],
    )


def qwenimage_transformer(
    width: int = 32, heads: int = 2, layers: int = 1
) -> QwenImageTransformer2DModel:
    head_dim = width // heads
    return QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=16,
        out_channels=4,
        num_layers=layers,
        attention_head_dim=head_dim,
        num_attention_heads=heads,
        joint_attention_dim=16,
        guidance_embeds=False,
        axes_dims_rope=(head_dim // 2, head_dim // 4, head_dim // 4),
    )


def _flux_vae(cls: type = AutoencoderKL, **extra: Any) -> Any:
    return cls(
        sample_size=32,
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",),
        up_block_types=("UpDecoderBlock2D",),
        block_out_channels=(4,),
        layers_per_block=1,
        latent_channels=1,
        norm_num_groups=1,
        use_quant_conv=False,
        use_post_quant_conv=False,
        **extra,
    )


def build_flux() -> FluxPipeline:
    torch.manual_seed(0)
    transformer = flux_transformer()
    vae = _flux_vae(shift_factor=0.0609, scaling_factor=1.5035)
    return FluxPipeline(
        scheduler=_flow_scheduler(),
        vae=vae,
        text_encoder=None,
        tokenizer=None,
        text_encoder_2=None,
        tokenizer_2=None,
        transformer=transformer,
    )


def flux_inputs(height: int = 16, width: int = 16) -> dict[str, Any]:
    return {
        "prompt_embeds": _embeds(1, 8, 32, seed=1),
        "pooled_prompt_embeds": _embeds(1, 32, seed=2),
        "guidance_scale": 3.5,
        "height": height,
        "width": width,
    }


def _flux2_transformer(guidance: bool) -> Flux2Transformer2DModel:
    return Flux2Transformer2DModel(
        patch_size=1,
        in_channels=4,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=16,
        timestep_guidance_channels=256,
        axes_dims_rope=[4, 4, 4, 4],
        guidance_embeds=guidance,
    )


def build_flux2() -> Flux2Pipeline:
    torch.manual_seed(0)
    transformer = _flux2_transformer(guidance=True)
    vae = _flux_vae(AutoencoderKLFlux2)
    return Flux2Pipeline(
        scheduler=_flow_scheduler(),
        vae=vae,
        text_encoder=None,
        tokenizer=None,
        transformer=transformer,
    )


def build_flux2_klein() -> Flux2KleinPipeline:
    torch.manual_seed(0)
    transformer = _flux2_transformer(guidance=False)
    vae = _flux_vae(AutoencoderKLFlux2)
    return Flux2KleinPipeline(
        scheduler=_flow_scheduler(),
        vae=vae,
        text_encoder=None,
        tokenizer=None,
        transformer=transformer,
    )


def flux2_inputs(height: int = 16, width: int = 16) -> dict[str, Any]:
    return {
        "prompt_embeds": _embeds(1, 8, 16, seed=1),
        "guidance_scale": 4.0,
        "height": height,
        "width": width,
    }


def flux2_klein_inputs(height: int = 16, width: int = 16) -> dict[str, Any]:
    # Klein guides with classifier-free guidance: a negative embedding too.
    return {**flux2_inputs(height, width), "negative_prompt_embeds": _embeds(1, 8, 16, seed=3)}


def build_qwenimage() -> QwenImagePipeline:
    torch.manual_seed(0)
    transformer = qwenimage_transformer()
    torch.manual_seed(0)
    vae = AutoencoderKLQwenImage(
        base_dim=24,
        z_dim=4,
        dim_mult=[1, 2, 4],
        num_res_blocks=1,
        temperal_downsample=[False, True],
        latents_mean=[0.0] * 4,
        latents_std=[1.0] * 4,
    )
    return QwenImagePipeline(
        scheduler=_flow_scheduler(),
        vae=vae,
        text_encoder=None,
        tokenizer=None,
        transformer=transformer,
    )


def qwenimage_inputs(height: int = 32, width: int = 32) -> dict[str, Any]:
    return {
        "prompt_embeds": _embeds(1, 8, 16, seed=1),
        "prompt_embeds_mask": torch.ones(1, 8, dtype=torch.long),
        "true_cfg_scale": 1.0,
        "height": height,
        "width": width,
    }


class SystemPromptLength:
    """Stands in for Qwen-Image 2.1's Qwen3-VL processor, which needs Hub files.

    The pipeline's constructor tokenizes its system prompt once to learn how many leading
    hidden states to drop from the text encoder's output; with ``prompt_embeds`` given, the
    processor is never called again. This answers that one question (the length is unused).
    """

    class _Tokenizer:
        def encode(self, text: str) -> list[int]:
            return [0]

    tokenizer = _Tokenizer()

    def apply_chat_template(self, messages: Any, **kwargs: Any) -> list[list[int]]:
        return [[0] * 8]


def build_qwenimage21() -> QwenImage21Pipeline:
    torch.manual_seed(0)
    transformer = QwenImage21Transformer2DModel(
        patch_size=1,
        in_channels=4,
        out_channels=4,
        num_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        context_in_dim=16,
        axes_dims_rope=(4, 6, 6),
    )
    torch.manual_seed(0)
    vae = AutoencoderKLQwenImage21(
        base_dim=8,
        decoder_base_dim=8,
        z_dim=4,
        dim_mult=[1, 1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, False, False, False],
        latents_mean=[0.0] * 4,
        latents_std=[1.0] * 4,
        in_channels=3,
        out_channels=3,
    )
    return QwenImage21Pipeline(
        scheduler=_flow_scheduler(),
        vae=vae,
        text_encoder=None,
        processor=SystemPromptLength(),
        transformer=transformer,
    )


def qwenimage21_inputs(height: int = 32, width: int = 32) -> dict[str, Any]:
    return {
        "prompt_embeds": _embeds(1, 8, 16, seed=1),
        "prompt_embeds_mask": torch.ones(1, 8, dtype=torch.long),
        "height": height,
        "width": width,
    }


def build_sdxl() -> StableDiffusionXLPipeline:
    torch.manual_seed(0)
    unet = UNet2DConditionModel(
        block_out_channels=(4, 8),
        layers_per_block=1,
        sample_size=16,
        in_channels=4,
        out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4),
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        transformer_layers_per_block=(1, 1),
        projection_class_embeddings_input_dim=80,  # 6 time ids x 8 + 32 pooled
        cross_attention_dim=64,
        norm_num_groups=1,
    )
    torch.manual_seed(0)
    vae = AutoencoderKL(
        block_out_channels=[4, 8],
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"],
        up_block_types=["UpDecoderBlock2D", "UpDecoderBlock2D"],
        latent_channels=4,
        norm_num_groups=1,
        sample_size=32,
    )
    scheduler = EulerDiscreteScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        steps_offset=1,
        beta_schedule="scaled_linear",
        timestep_spacing="leading",
    )
    return StableDiffusionXLPipeline(
        vae=vae,
        text_encoder=None,
        text_encoder_2=None,
        tokenizer=None,
        tokenizer_2=None,
        unet=unet,
        scheduler=scheduler,
    )


def sdxl_inputs(height: int = 32, width: int = 32) -> dict[str, Any]:
    return {
        "prompt_embeds": _embeds(1, 8, 64, seed=1),
        "pooled_prompt_embeds": _embeds(1, 32, seed=2),
        "negative_prompt_embeds": _embeds(1, 8, 64, seed=3),
        "negative_pooled_prompt_embeds": _embeds(1, 32, seed=4),
        "guidance_scale": 5.0,
        "height": height,
        "width": width,
    }


def build_wan() -> WanPipeline:
    torch.manual_seed(0)
    vae = AutoencoderKLWan(
        base_dim=3,
        z_dim=16,
        dim_mult=[1, 1, 1, 1],
        num_res_blocks=1,
        temperal_downsample=[False, True, True],
    )
    torch.manual_seed(0)
    transformer = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=2,
        attention_head_dim=12,
        in_channels=16,
        out_channels=16,
        text_dim=32,
        freq_dim=256,
        ffn_dim=32,
        num_layers=1,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    )
    return WanPipeline(
        tokenizer=None,
        text_encoder=None,
        transformer=transformer,
        vae=vae,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
    )


def wan_inputs(height: int = 16, width: int = 16) -> dict[str, Any]:
    return {
        "prompt_embeds": _embeds(1, 8, 32, seed=1),
        "negative_prompt_embeds": _embeds(1, 8, 32, seed=3),
        "guidance_scale": 5.0,
        "num_frames": 5,
        "height": height,
        "width": width,
    }


@dataclass(frozen=True)
class Case:
    """One pipeline: how to build it, its inputs at a resolution, its denoiser's attribute."""

    name: str
    build: Callable[[], DiffusionPipeline]
    inputs: Callable[..., dict[str, Any]]
    denoiser: str = "transformer"
    tensor_parallel: bool = False  # the denoiser class has a `_tp_plan`
    context_parallel: bool = False  # the denoiser class has a `_cp_plan`
    other_size: tuple[int, int] = (32, 32)  # a second resolution for the compile test
    # Qwen-Image 2.1's transformer calls .tolist() on a float tensor (its rotary embedding),
    # which Dynamo cannot trace on any device: it compiles with graph breaks.
    fullgraph: bool = True


CASES = {
    case.name: case
    for case in (
        Case("flux", build_flux, flux_inputs, tensor_parallel=True, context_parallel=True),
        Case("flux2", build_flux2, flux2_inputs, tensor_parallel=True, context_parallel=True),
        Case(
            "flux2_klein",
            build_flux2_klein,
            flux2_klein_inputs,
            tensor_parallel=True,
            context_parallel=True,
        ),
        Case(
            "qwenimage",
            build_qwenimage,
            qwenimage_inputs,
            tensor_parallel=True,
            context_parallel=True,
            other_size=(48, 48),
        ),
        Case(
            "qwenimage21",
            build_qwenimage21,
            qwenimage21_inputs,
            tensor_parallel=True,
            other_size=(48, 48),
            fullgraph=False,
        ),
        Case("sdxl", build_sdxl, sdxl_inputs, denoiser="unet", other_size=(48, 48)),
        Case("wan", build_wan, wan_inputs, context_parallel=True, other_size=(32, 32)),
    )
}


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
            prompt=MINIMAX_H3_PROMPT,
            generator=generator,
            num_inference_steps=3,
            height=height,
            width=width,
            num_frames=MINIMAX_H3_FRAMES,
            output_type="pt",
        )
    return state.get("videos").cpu(), state.get("audio").cpu()


def to_device(inputs: dict[str, Any], device: str) -> dict[str, Any]:
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def run(
    pipe: DiffusionPipeline,
    inputs: dict[str, Any],
    device: str,
    seed: int = 0,
    generator_device: str | None = None,
) -> torch.Tensor:
    """The pipeline's decoded output (a CPU tensor) for ``seed``, 2 steps, on ``device``.

    The generator lives on ``generator_device`` (default: ``device``), as a user on that
    device would create it.
    """
    generator = torch.Generator(generator_device or device).manual_seed(seed)
    with torch.no_grad():
        out = pipe(
            **to_device(inputs, device),
            num_inference_steps=STEPS,
            generator=generator,
            output_type="pt",
            return_dict=False,
        )[0]
    return out.cpu()


def compiled_vs_eager(case: Case) -> tuple[list[float], int]:
    """``torch.compile(denoiser, backend="neuron")`` against eager on neuron, at the case's
    two resolutions and then the first again.

    Returns the largest output difference per run and how many graphs the neuron backend
    compiled (one per resolution is the expectation: the two denoising steps of a run and
    the repeated resolution reuse them).
    """
    pipe = case.build().to("neuron")
    sizes: list[tuple[int, ...]] = [(), case.other_size, ()]
    eager = [run(pipe, case.inputs(*size), "neuron") for size in sizes[:2]]
    eager.append(eager[0])
    denoiser = getattr(pipe, case.denoiser)
    compiled = torch.compile(denoiser, backend="neuron", fullgraph=case.fullgraph)
    setattr(pipe, case.denoiser, compiled)
    torch._dynamo.reset()
    before = torch.neuron.get_dynamo_metrics()["compiles"]
    diffs = [
        (run(pipe, case.inputs(*size), "neuron") - expected).abs().max().item()
        for size, expected in zip(sizes, eager, strict=True)
    ]
    return diffs, torch.neuron.get_dynamo_metrics()["compiles"] - before


def main() -> None:
    """The compile check for every case (or the named ones): python tests/diffusers_fixtures.py"""
    import sys
    import time

    for name in sys.argv[1:] or list(CASES):
        case = CASES[name]
        start = time.perf_counter()
        diffs, compiles = compiled_vs_eager(case)
        print(
            f"{name}: fullgraph={case.fullgraph} max diff per run "
            f"{', '.join(f'{d:.2e}' for d in diffs)}; backend compiles {compiles}; "
            f"{time.perf_counter() - start:.0f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
