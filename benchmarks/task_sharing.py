"""What a waiting thread adds: native kernels launched, then waited for, alone vs shared.

A thread blocked on device work runs tasks of the kernel the stream's worker computes
(csrc/runtime/task_board.h). For each kernel below, blocks of launches followed by one
synchronize alternate between sharing off (`_C._set_waiters_help(False)`: the worker
computes alone) and on, in the same run; speedup = alone / shared wall time per call
(medians). On 2 cores the ceiling is about 2x for compute-bound kernels, less for
memory-bound ones (two threads read ~1.4x what one does on the AVX2 host).

The products are those of a training step of the fine-tuning benchmark's model (512
tokens, hidden 512, k/v 256, MLP 1408) and of the 100M Llama at 64 rows, where few output
tiles (3 for a k/v projection or a 64-row gradient) left one thread idle before tiles
narrowed for sharing (gemm_tiles.h, tile_shape). The row kernels run over an LM head's
logits and an MLP activation.

    python benchmarks/task_sharing.py
    python benchmarks/task_sharing.py --quick
    python benchmarks/task_sharing.py --markdown
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from _harness import (
    Table,
    calibrate,
    fmt,
    gc_paused,
    geomean,
    interleaved,
    parse_and_start,
    print_table,
)

import torchneuron

C = torchneuron._C


@dataclass
class Kernel:
    name: str
    shape: str
    make: Callable[[], Callable[[], object]]  # builds the operands, returns one call


def product(m: int, n: int, k: int, kind: str) -> Callable[[], Callable[[], object]]:
    """A linear layer's product as autograd issues it: fwd X·Wᵀ, dgrad dY·W, wgrad dYᵀ·X."""

    def make() -> Callable[[], object]:
        g = torch.Generator().manual_seed(m + n + k)
        w = torch.randn(n, k, generator=g).to("neuron")
        if kind == "fwd":
            a, b = torch.randn(m, k, generator=g).to("neuron"), w.t()
        elif kind == "dgrad":
            a, b = torch.randn(m, n, generator=g).to("neuron"), w
        else:
            dy, x = torch.randn(m, n, generator=g), torch.randn(m, k, generator=g)
            a, b = dy.to("neuron").t(), x.to("neuron")
        return lambda: torch.mm(a, b)

    return make


def rows(
    fn: Callable[[torch.Tensor], object], r: int, c: int
) -> Callable[[], Callable[[], object]]:
    def make() -> Callable[[], object]:
        x = torch.randn(r, c, generator=torch.Generator().manual_seed(r)).to("neuron")
        return lambda: fn(x)

    return make


def kernels(quick: bool) -> list[Kernel]:
    out = [
        Kernel("k/v proj fwd", "512x256x512", product(512, 256, 512, "fwd")),
        Kernel("q/o proj fwd", "512x512x512", product(512, 512, 512, "fwd")),
        Kernel("k/v proj dgrad", "512x512x256", product(512, 256, 512, "dgrad")),
        Kernel("attn dgrad", "64x768x768", product(64, 768, 768, "dgrad")),
        Kernel("mlp_down fwd", "64x768x2048", product(64, 768, 2048, "fwd")),
        Kernel("mlp_up wgrad", "1408x512x512", product(512, 1408, 512, "wgrad")),
        Kernel("log_softmax", "512x8000", rows(lambda x: torch.log_softmax(x, -1), 512, 8000)),
        Kernel("silu", "512x1408", rows(torch.nn.functional.silu, 512, 1408)),
    ]
    if not quick:
        out += [
            Kernel("attn fwd", "512x768x768", product(512, 768, 768, "fwd")),
            Kernel("lm_head wgrad", "8000x512x512", product(512, 8000, 512, "wgrad")),
            Kernel("softmax", "512x8000", rows(lambda x: torch.softmax(x, -1), 512, 8000)),
        ]
    return out


def sharing(enabled: bool, call: Callable[[], object]) -> Callable[[], object]:
    def run() -> object:
        C._set_waiters_help(enabled)
        return call()

    return run


def main(argv: list[str] | None = None) -> int:
    args = parse_and_start(
        "native kernels launched then waited for: worker alone vs shared with the waiter",
        "fewer kernels and rounds",
        sys.argv[1:] if argv is None else argv,
    )
    if args is None:
        return 1
    if C._launch_blocking():
        print("blocking launches (NEURON_LAUNCH_BLOCKING=1): no worker, nothing shared")
        return 1
    before = C._waiters_help()
    body, speedups = [], []
    try:
        for kernel in kernels(args.quick):
            call = kernel.make()
            fns = {"neuron alone": sharing(False, call), "neuron shared": sharing(True, call)}
            iterations = max(calibrate(fn, "neuron", 0.05, most=50) for fn in fns.values())
            with gc_paused():
                seconds = interleaved(fns, iterations, rounds=5 if args.quick else 9)
            alone, shared = seconds["neuron alone"], seconds["neuron shared"]
            speedups.append(alone / shared)
            body.append(
                [
                    kernel.name,
                    kernel.shape,
                    fmt(alone * 1e3),
                    fmt(shared * 1e3),
                    f"{alone / shared:.2f}",
                ]
            )
            print(f"  {kernel.name} {kernel.shape}: speedup {alone / shared:.2f}", flush=True)
    finally:
        C._set_waiters_help(before)
    header = ["kernel", "shape", "alone ms", "shared ms", "speedup"]
    print_table(Table(header, body), args.markdown)
    print(f"geometric mean speedup: {geomean(speedups):.2f} over {len(speedups)} kernels")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
