"""Native row kernels on neuron against PyTorch CPU eager: softmax, log_softmax, SiLU.

For each kernel (forward and backward), dtype (float32, bfloat16) and a shape a Hugging
Face Llama produces, the same inputs are built on both devices and timed in alternating
blocks (medians; see _harness.py).

    ratio = CPU time per call / neuron time per call     (> 1: neuron is faster)

Shapes: the loss's logits of benchmarks/training.py (512 tokens x 8000 vocabulary) and of a
64-token prefill of the 100M model of benchmarks/hf_generate.py (64 x 32000); eager
attention probabilities (4 x 8 heads x 128 queries, 128 keys); the SiLU-gated MLP's gate
of training.py (512 x 1408) and of one decode token of hf_generate.py (1 x 2048).

    python benchmarks/row_kernels.py               # 1 intra-op thread
    python benchmarks/row_kernels.py --threads 2   # both cores per kernel
    python benchmarks/row_kernels.py --quick       # fewer repeats
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
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


@dataclass(frozen=True)
class Case:
    kernel: str
    shape: tuple[int, ...]
    make: Callable[[str, torch.dtype], Callable[[], object]]


def _inputs(shape: tuple[int, ...], dtype: torch.dtype, device: str, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 3).to(dtype).to(device)


def make_case(kernel: str, shape: tuple[int, ...]) -> Case:
    def bind(device: str, dtype: torch.dtype) -> Callable[[], object]:
        x = _inputs(shape, dtype, device, 0)
        grad = _inputs(shape, dtype, device, 1)
        if kernel == "softmax":
            return lambda: torch.softmax(x, -1)
        if kernel == "log_softmax":
            return lambda: torch.log_softmax(x, -1)
        if kernel == "softmax_backward":
            y = torch.softmax(x, -1)
            return lambda: torch.ops.aten._softmax_backward_data(grad, y, -1, dtype)
        if kernel == "log_softmax_backward":
            y = torch.log_softmax(x, -1)
            return lambda: torch.ops.aten._log_softmax_backward_data(grad, y, -1, dtype)
        if kernel == "silu":
            return lambda: F.silu(x)
        if kernel == "silu_backward":
            return lambda: torch.ops.aten.silu_backward(grad, x)
        raise ValueError(kernel)

    return Case(kernel, shape, bind)


LOGITS_TRAIN, LOGITS_PREFILL, ATTENTION = (512, 8000), (64, 32000), (4, 8, 128, 128)
GATE_TRAIN, GATE_DECODE = (512, 1408), (1, 2048)
CASES = [
    make_case("log_softmax", LOGITS_TRAIN),
    make_case("log_softmax_backward", LOGITS_TRAIN),
    make_case("log_softmax", LOGITS_PREFILL),
    make_case("softmax", ATTENTION),
    make_case("softmax_backward", ATTENTION),
    make_case("silu", GATE_TRAIN),
    make_case("silu_backward", GATE_TRAIN),
    make_case("silu", GATE_DECODE),
]


def main(argv: list[str] | None = None) -> int:
    args = parse_and_start(__doc__.splitlines()[0], "fewer repeats", argv)
    if args is None:
        return 1
    isa = torchneuron._C._kernel_isa()
    print(
        f"CPU model: {isa['model']}; kernel ISA: {isa['isa']}; native kernels: "
        f"{'on' if torchneuron._C._native_kernels_enabled() else 'off'}",
        flush=True,
    )
    rounds = 5 if args.quick else 9
    table = Table(["kernel", "shape", "dtype", "cpu us", "neuron us", "ratio"], [])
    ratios: list[float] = []
    for case in CASES:
        for dtype in (torch.float32, torch.bfloat16):
            fns = {"cpu": case.make("cpu", dtype), "neuron": case.make("neuron", dtype)}
            iterations = max(calibrate(fns["cpu"], "cpu", 0.02), 1)
            with gc_paused():
                seconds = interleaved(fns, iterations, rounds)
            ratio = seconds["cpu"] / seconds["neuron"]
            ratios.append(ratio)
            table.body.append(
                [
                    case.kernel,
                    "x".join(map(str, case.shape)),
                    str(dtype).removeprefix("torch."),
                    fmt(seconds["cpu"] * 1e6),
                    fmt(seconds["neuron"] * 1e6),
                    f"{ratio:.2f}",
                ]
            )
            print("  " + "  ".join(table.body[-1]), flush=True)
    print_table(table, args.markdown)
    print(f"\ngeomean ratio {geomean(ratios):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
