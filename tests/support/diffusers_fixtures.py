"""Small Diffusers pipelines built from configs with random weights, for tests and examples.

Each case builds a pipeline without text encoders or tokenizers (the Hub is not reachable):
its inputs carry ``prompt_embeds`` (and pooled or negative embeddings where the pipeline needs
them), drawn from a fixed CPU seed, so a CPU run and a neuron run see the same conditioning.
Weights come from a fixed seed too, so two builds are identical. MiniMax-H3's modular
pipeline, which runs whole, text encoder included, is built in minimax_h3_fixtures.py. Every
pipeline runs 2
denoising steps at a small resolution; the tiny VAEs keep decoding cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from diffusers import (
    AutoencoderKL,
    AutoencoderKLFlux2,
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
    QwenImage21Pipeline,
    QwenImage21Transformer2DModel,
    QwenImagePipeline,
    QwenImageTransformer2DModel,
    StableDiffusionXLPipeline,
    UNet2DConditionModel,
    WanPipeline,
    WanTransformer3DModel,
)

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
    """The compile check for every case (or the named ones):
    python tests/support/diffusers_fixtures.py [CASE ...]"""
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
