"""A FLUX.1 pipeline on neuron: eager, compiled, and tensor-parallel.

The pipeline is small and random (built from a config; nothing is downloaded), and takes
prompt embeddings instead of text encoders. Each mode writes a PNG and prints its largest
difference from the eager image.

    python examples/diffusers_pipeline.py                                   # eager + compiled
    torchrun --nproc_per_node=2 examples/diffusers_pipeline.py --tp         # tensor-parallel
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from diffusers import (
    AutoencoderKL,
    FlowMatchEulerDiscreteScheduler,
    FluxPipeline,
    FluxTransformer2DModel,
    TensorParallelConfig,
)


def build_pipeline() -> FluxPipeline:
    torch.manual_seed(0)  # the same random weights in every process
    transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=2, num_single_layers=2,
        attention_head_dim=32, num_attention_heads=4, joint_attention_dim=64,
        pooled_projection_dim=64, axes_dims_rope=[8, 12, 12],
    )  # fmt: skip
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, latent_channels=1, block_out_channels=(8, 16, 16, 16),
        down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
        layers_per_block=1, norm_num_groups=8, use_quant_conv=False, use_post_quant_conv=False,
        shift_factor=0.0, scaling_factor=1.0,
    )  # fmt: skip
    return FluxPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, transformer=transformer,
        text_encoder=None, tokenizer=None, text_encoder_2=None, tokenizer_2=None,
    )  # fmt: skip


def generate(pipe: FluxPipeline) -> torch.Tensor:
    """A 128x128 image, 4 steps, from fixed prompt embeddings and a neuron generator."""
    embeds = torch.Generator().manual_seed(1)
    return pipe(
        prompt_embeds=torch.randn(1, 16, 64, generator=embeds).to("neuron"),
        pooled_prompt_embeds=torch.randn(1, 64, generator=embeds).to("neuron"),
        height=128,
        width=128,
        num_inference_steps=4,
        generator=torch.Generator("neuron").manual_seed(0),
        output_type="pt",
    ).images.cpu()


def save(image: torch.Tensor, path: str) -> None:
    from PIL import Image

    pixels = (image[0].permute(1, 2, 0).clamp(0, 1) * 255).round().to(torch.uint8).numpy()
    Image.fromarray(pixels).save(path)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", action="store_true", help="tensor-parallel (run under torchrun)")
    parser.add_argument("--out", default=".", help="directory for the PNGs")
    args = parser.parse_args()

    if args.tp:
        torch.neuron.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("neuron")
    rank = dist.get_rank() if args.tp else 0

    pipe = build_pipeline().to("neuron")
    eager = generate(pipe)
    if rank == 0:
        save(eager, os.path.join(args.out, "flux_eager.png"))

    if args.tp:
        pipe = build_pipeline()  # sharded from CPU weights, then moved to this rank's device
        pipe.transformer.enable_parallelism(
            config=TensorParallelConfig(tp_degree=dist.get_world_size())
        )
        pipe.to("neuron")
        mode, image = f"tensor-parallel x{dist.get_world_size()}", generate(pipe)
    else:
        pipe.transformer = torch.compile(pipe.transformer, backend="neuron", fullgraph=True)
        mode, image = "compiled", generate(pipe)
        print("graphs compiled:", torch.neuron.get_dynamo_metrics()["compiles"])
    if rank == 0:
        save(image, os.path.join(args.out, "flux_tp.png" if args.tp else "flux_compiled.png"))
        print(f"{mode}: max |difference| vs eager = {(image - eager).abs().max().item():.2e}")
    if args.tp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
