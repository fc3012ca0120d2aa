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
from collections.abc import Callable
from typing import Any

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
# Diffusers requires the split sequence to divide by the number of ranks. Wan's default test
# video (5 frames at 16x16) has 2 tokens, its second resolution (32x32) 8. MiniMax-H3 packs
# one row per prompt byte with 37 video and 414 audio rows: its 15-byte prompt makes 466, a
# 17-byte one 468.
FOUR_RANK_SIZE = {"wan": (32, 32)}
FOUR_RANK_MINIMAX_H3_PROMPT = "one robot dancing"


def _outputs(result: Any) -> tuple[torch.Tensor, ...]:
    return result if isinstance(result, tuple) else (result,)


def compare(
    rank: int, name: str, modes: dict, build: Callable, denoiser_of: Callable, run: Callable
) -> None:
    """Prints, per mode, the largest difference between `run` of a fresh `build()` whose
    denoiser (`denoiser_of`) is split over the ranks in that mode and `run` on one device."""
    one_device = run(build())
    for mode, (config, backend) in modes.items():
        parallel_target = build()
        denoiser = denoiser_of(parallel_target)
        if backend is not None:
            denoiser.set_attention_backend(backend)
        denoiser.enable_parallelism(config=config(dist.get_world_size()))
        parallel = run(parallel_target)
        pairs = zip(_outputs(parallel), _outputs(one_device), strict=True)
        diff = max((p - o).abs().max().item() for p, o in pairs)
        print(f"rank {rank} {name} {mode} max_diff={diff:.3e}", flush=True)


def main(names: list[str]) -> None:
    rank = int(os.environ["RANK"])
    torch.neuron.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("neuron")
    modes = MODES if dist.get_world_size() == 2 else UNIFIED_MODES
    for name in names:
        case = fixtures.CASES[name]
        size = FOUR_RANK_SIZE.get(name, ()) if dist.get_world_size() == 4 else ()
        compare(
            rank, name, modes,
            build=lambda case=case: case.build().to("neuron"),
            denoiser_of=lambda pipe, case=case: getattr(pipe, case.denoiser),
            run=lambda pipe, case=case, size=size: fixtures.run(pipe, case.inputs(*size), "neuron"),
        )  # fmt: skip
    minimax_h3(rank, modes)
    for name in cp_transformers.MODELS:
        transformer(rank, name, modes)
    dist.destroy_process_group()


def minimax_h3(rank: int, modes: dict) -> None:
    """MiniMax-H3's t2va modular pipeline (tests/support/minimax_h3_fixtures.py): its
    transformer's _cp_plan splits the packed sequence at the first block and gathers it at the
    output heads; the video and audio it decodes are compared."""

    four_ranks = dist.get_world_size() == 4
    prompt = FOUR_RANK_MINIMAX_H3_PROMPT if four_ranks else minimax_h3_fixtures.MINIMAX_H3_PROMPT

    def build() -> Any:
        pipe = minimax_h3_fixtures.build_minimax_h3()
        pipe.to("neuron")
        return pipe

    compare(
        rank, "minimax_h3", modes, build,
        denoiser_of=lambda pipe: pipe.transformer,
        run=lambda pipe: minimax_h3_fixtures.run_minimax_h3(pipe, "neuron", prompt=prompt),
    )  # fmt: skip


@torch.no_grad()
def transformer(rank: int, name: str, modes: dict) -> None:
    """A transformer alone (tests/support/cp_transformer_fixtures.py: LTX-Video, LTX-2, Helios,
    ChronoEdit); every output tensor is compared."""
    _, inputs = cp_transformers.MODELS[name]()  # the same inputs every build
    on_device = fixtures.to_device(inputs, "neuron")
    compare(
        rank, name, modes,
        build=lambda: cp_transformers.MODELS[name]()[0].to("neuron"),
        denoiser_of=lambda model: model,
        run=lambda model: model(**on_device),
    )  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
