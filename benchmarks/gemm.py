"""GEMM throughput of neuron's native kernels vs CPU eager vs the host's measured peak.

The products are those of a Llama's linear layers: forward Y = X·Wᵀ, grad_input dY·W and
grad_weight dYᵀ·X, at the shapes of a ~100M Llama (hidden 768, intermediate 2048, vocab
32000) and a ~1B Llama (hidden 2048, intermediate 8192, vocab 32000), for M (tokens) = 1
(decode: forward only, there is no backward at batch-1 decode), 64, 512 and 4096, in float32
and bfloat16. Neuron and CPU blocks alternate (medians); the peak is one core's measured
multiply-add rate at the kernels' instruction set (torchneuron::fma_peak_flops: an FMA or
vdpbf16ps loop with no memory traffic). The host is shared, so rates are flop per CPU-second
of the process (all threads: time given to other processes does not count, OpenMP threads
spinning idle do), i.e. per-core efficiency, compared with one core's peak; the wall-clock
ratio is printed beside it.

    python benchmarks/gemm.py                # all shapes, 1 thread (a few minutes)
    python benchmarks/gemm.py --threads 2
    python benchmarks/gemm.py --quick        # 100M shapes, M <= 512
    python benchmarks/gemm.py --quick --max-m 64   # also skip M above 64

Trimmed to keep a run to minutes: M=4096 runs only the 100M model's attention and MLP
layers (its LM head alone is 0.2 TFLOP per product), and the 1B LM head only M <= 64.
Neuron's side is the native GEMM: the script pins TORCHNEURON_GEMM_ROUTE=native unless the
variable is set (``measure``, the device's default, sends a float32 class to MKL where MKL
was measured faster; ``library`` always does).
Targets (issue 15): >= 70% of peak for M >= 64; bf16 at least fp32's speed on hosts without
native bf16; >= 1.5x CPU eager bf16 where CPU eager is below 50% of peak.
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
import time
from dataclasses import dataclass

os.environ.setdefault("TORCHNEURON_GEMM_ROUTE", "native")  # read at the first product

import torch
from _harness import (
    Op,
    Table,
    calibrate,
    fmt,
    gc_paused,
    geomean,
    parse_and_start,
    print_table,
)

import torchneuron
from torchneuron.compile.native_gemm import native_gemm_calls, native_kernels_enabled

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Layer:
    model: str
    name: str
    out_features: int  # N
    in_features: int  # K
    largest_m: int  # trims the sweep (see the module docstring)


def layers(quick: bool) -> list[Layer]:
    small = [
        Layer("100M", "attn", 768, 768, 4096),
        Layer("100M", "mlp_up", 2048, 768, 4096),
        Layer("100M", "mlp_down", 768, 2048, 4096),
        Layer("100M", "lm_head", 32000, 768, 512),
    ]
    if quick:
        return [dataclass_replace(layer, 512) for layer in small]
    return small + [
        Layer("1B", "attn", 2048, 2048, 512),
        Layer("1B", "mlp_up", 8192, 2048, 512),
        Layer("1B", "mlp_down", 2048, 8192, 512),
        Layer("1B", "lm_head", 32000, 2048, 64),
    ]


def dataclass_replace(layer: Layer, largest_m: int) -> Layer:
    return Layer(layer.model, layer.name, layer.out_features, layer.in_features, largest_m)


def operands(
    kind: str, m: int, layer: Layer, dtype: torch.dtype, device: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The two matrices of one product, as views the autograd of nn.Linear produces."""
    g = torch.Generator().manual_seed(m * 7 + layer.out_features)
    n, k = layer.out_features, layer.in_features
    w = torch.randn(n, k, generator=g).to(dtype).to(device)
    if kind == "fwd":
        return torch.randn(m, k, generator=g).to(dtype).to(device), w.t()
    dy = torch.randn(m, n, generator=g).to(dtype).to(device)
    if kind == "dgrad":
        return dy, w
    x = torch.randn(m, k, generator=g).to(dtype).to(device)
    return dy.t(), x  # wgrad


def flops_of(a: torch.Tensor, b: torch.Tensor) -> float:
    return 2.0 * a.shape[0] * a.shape[1] * b.shape[1]


def measure_peak(bf16: bool) -> float:
    """One core's multiply-add peak in flop per CPU-second, best of 15 short loops."""
    op = torch.ops.torchneuron.fma_peak_flops
    op(bf16, 200_000)  # warm the core up
    return max(float(op(bf16, 500_000)) for _ in range(15))


def time_blocks(fns: dict[str, Op], iterations: int, rounds: int) -> dict[str, tuple[float, float]]:
    """Median (CPU seconds, wall seconds) per call for each side, from alternating blocks.

    CPU time is the process's (all its threads), so time the host gave to other processes
    does not count: on a shared host it is the steadier measure of what a kernel costs.
    """
    sides = list(fns)
    for side in sides:  # warm-up
        fns[side]()
    cpu: dict[str, list[float]] = {side: [] for side in sides}
    wall: dict[str, list[float]] = {side: [] for side in sides}
    for r in range(rounds):
        for side in sides if r % 2 == 0 else sides[::-1]:
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(iterations):
                fns[side]()
            torch.neuron.synchronize()
            cpu[side].append((time.process_time() - c0) / iterations)
            wall[side].append((time.perf_counter() - w0) / iterations)
    return {s: (statistics.median(cpu[s]), statistics.median(wall[s])) for s in sides}


def measure(
    kind: str, m: int, layer: Layer, dtype: torch.dtype, quick: bool
) -> dict[str, tuple[float, float]]:
    """{side: (flop per CPU-second, flop per wall-second)} of one product."""
    a_cpu, b_cpu = operands(kind, m, layer, dtype, "cpu")
    a_dev, b_dev = operands(kind, m, layer, dtype, "neuron")
    fns = {
        "cpu": functools.partial(torch.mm, a_cpu, b_cpu),
        "neuron": functools.partial(torch.mm, a_dev, b_dev),
    }
    budget = 0.04 if quick else 0.1
    iterations = max(
        calibrate(fns["cpu"], "cpu", budget), calibrate(fns["neuron"], "neuron", budget)
    )
    with gc_paused():
        times = time_blocks(fns, iterations, rounds=3 if quick else 5)
    flops = flops_of(a_cpu, b_cpu)
    return {side: (flops / c, flops / w) for side, (c, w) in times.items()}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    max_m = 4096  # --max-m N: skip larger M (e.g. where CPU eager bf16 takes seconds a call)
    if "--max-m" in argv:
        at = argv.index("--max-m")
        max_m = int(argv[at + 1])
        del argv[at : at + 2]
    args = parse_and_start(
        "native GEMM vs CPU eager vs the host's peak",
        "100M shapes only, M <= 512",
        argv,
    )
    if args is None:
        return 1
    info = torchneuron._C._kernel_isa()
    threads = torch.get_num_threads()
    print(
        f"CPU {info['model']}, kernel ISA {info['isa']}, native kernels "
        f"{'on' if native_kernels_enabled() else 'off'}"
    )
    peaks = {name: measure_peak(name == "bf16") for name in DTYPES}
    print(
        f"measured peak per core ({threads} thread(s) in the products): "
        + ", ".join(f"{name} {peaks[name] / 1e9:.1f} GFLOP/s" for name in DTYPES),
        flush=True,
    )

    rows = []
    ratios: dict[str, list[float]] = {name: [] for name in DTYPES}
    peak_fractions: dict[str, list[float]] = {name: [] for name in DTYPES}
    calls_before = native_gemm_calls()
    for layer in layers(args.quick):
        for m in (1, 64, 512, 4096):
            if m > min(layer.largest_m, max_m):
                continue
            for kind in ("fwd",) if m == 1 else ("fwd", "dgrad", "wgrad"):
                for name, dtype in DTYPES.items():
                    rates = measure(kind, m, layer, dtype, args.quick)
                    cpu_rate, dev_rate = rates["cpu"][0], rates["neuron"][0]
                    ratio = dev_rate / cpu_rate
                    wall_ratio = rates["neuron"][1] / rates["cpu"][1]
                    ratios[name].append(ratio)
                    if m >= 64:
                        peak_fractions[name].append(dev_rate / peaks[name])
                    rows.append(
                        [
                            layer.model,
                            layer.name,
                            str(m),
                            str(layer.out_features),
                            str(layer.in_features),
                            kind,
                            name,
                            fmt(cpu_rate / 1e9),
                            fmt(dev_rate / 1e9),
                            fmt(ratio),
                            fmt(wall_ratio),
                            f"{100 * cpu_rate / peaks[name]:.0f}%",
                            f"{100 * dev_rate / peaks[name]:.0f}%",
                        ]
                    )
                    print("  ".join(rows[-1]), flush=True)
    header = [
        "model",
        "layer",
        "M",
        "N",
        "K",
        "product",
        "dtype",
        "CPU GF/s",
        "neuron GF/s",
        "neuron/CPU",
        "(wall)",
        "CPU %peak",
        "neuron %peak",
    ]
    print_table(Table(header, rows), args.markdown)
    print()
    for name in DTYPES:
        fractions = peak_fractions[name]
        print(
            f"{name}: neuron/CPU geomean {geomean(ratios[name]):.2f}x over {len(ratios[name])}"
            f" products; M>=64 neuron at {100 * statistics.median(fractions):.0f}% of peak "
            f"(median; min {100 * min(fractions):.0f}%)"
        )
    print(f"native GEMM calls in this run: {native_gemm_calls() - calls_before}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
