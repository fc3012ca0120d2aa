"""One torchrun rank of the Diffusers context-parallel test (tests/test_diffusers_parallel.py).

For each named case: the pipeline's output on one neuron device, then the same pipeline with
its denoiser's sequence split over the ranks by ``enable_parallelism(config=
ContextParallelConfig(...))``: Ulysses (all-to-all of heads) with the default attention
backend, and ring attention (key/value blocks rotated, partial results merged through their
logsumexp) with the ``_native_flash`` backend, which returns the logsumexp ring attention needs
(aten::_scaled_dot_product_flash_attention on neuron). Prints one line per case and mode with
the largest difference, which the test checks against its tolerance.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from diffusers import ContextParallelConfig

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
import support.cp_transformer_fixtures as cp_transformers  # noqa: E402
import support.diffusers_fixtures as fixtures  # noqa: E402
import support.minimax_h3_fixtures as minimax_h3_fixtures  # noqa: E402

MODES = {
    "ulysses": (lambda n: ContextParallelConfig(ulysses_degree=n), None),
    "ring": (lambda n: ContextParallelConfig(ring_degree=n), "_native_flash"),
}
# On 4 ranks: unified context parallelism, Ulysses within pairs of ranks and a ring between them.
UNIFIED_MODES = {
    "unified": (
        lambda n: ContextParallelConfig(ring_degree=2, ulysses_degree=n // 2),
        "_native_flash",
    ),
}


def main(names: list[str]) -> None:
    rank = int(os.environ["RANK"])
    torch.neuron.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("neuron")
    modes = MODES if dist.get_world_size() == 2 else UNIFIED_MODES
    for name in names:
        case = fixtures.CASES[name]
        one_device = fixtures.run(case.build().to("neuron"), case.inputs(), "neuron")
        for mode, (config, backend) in modes.items():
            pipe = case.build().to("neuron")
            denoiser = getattr(pipe, case.denoiser)
            if backend is not None:
                denoiser.set_attention_backend(backend)
            denoiser.enable_parallelism(config=config(dist.get_world_size()))
            parallel = fixtures.run(pipe, case.inputs(), "neuron")
            diff = (parallel - one_device).abs().max().item()
            print(f"rank {rank} {name} {mode} max_diff={diff:.3e}", flush=True)
    if dist.get_world_size() == 2:
        minimax_h3(rank)
        for name in cp_transformers.MODELS:
            transformer(rank, name)
    dist.destroy_process_group()


def minimax_h3(rank: int) -> None:
    """MiniMax-H3's t2va modular pipeline (tests/support/minimax_h3_fixtures.py): its
    transformer's _cp_plan splits the packed sequence at the first block and gathers it at the
    output heads; the video and audio it decodes are compared."""
    one_device = minimax_h3_fixtures.run_minimax_h3(
        minimax_h3_fixtures.build_minimax_h3(), "neuron"
    )
    for mode, (config, backend) in MODES.items():
        pipe = minimax_h3_fixtures.build_minimax_h3()
        pipe.to("neuron")
        if backend is not None:
            pipe.transformer.set_attention_backend(backend)
        pipe.transformer.enable_parallelism(config=config(dist.get_world_size()))
        parallel = minimax_h3_fixtures.run_minimax_h3(pipe, "neuron")
        diff = max((p - o).abs().max().item() for p, o in zip(parallel, one_device, strict=True))
        print(f"rank {rank} minimax_h3 {mode} max_diff={diff:.3e}", flush=True)


@torch.no_grad()
def transformer(rank: int, name: str) -> None:
    """A transformer alone (tests/support/cp_transformer_fixtures.py: LTX-Video, LTX-2, Helios,
    ChronoEdit), one device against each mode; every output tensor is compared."""
    build = cp_transformers.MODELS[name]
    model, inputs = build()
    one_device = model.to("neuron")(**cp_transformers.to_device(inputs, "neuron"))
    for mode, (config, backend) in MODES.items():
        model, inputs = build()
        model.to("neuron")
        if backend is not None:
            model.set_attention_backend(backend)
        model.enable_parallelism(config=config(dist.get_world_size()))
        parallel = model(**cp_transformers.to_device(inputs, "neuron"))
        diff = max((p - o).abs().max().item() for p, o in zip(parallel, one_device, strict=True))
        print(f"rank {rank} {name} {mode} max_diff={diff:.3e}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
