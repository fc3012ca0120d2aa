"""Eager-mode cost of the neuron device against PyTorch CPU eager, measured in one run.

Two families of measurements, each reported as a ratio against CPU eager on the same host in
the same process (absolute times on shared machines mean little):

* dispatch overhead: microseconds per call of tiny ops (4x4 / 8-element tensors), where the
  time is all framework overhead. ratio = neuron time / CPU time, target <= 1.3.
* throughput: large elementwise ops (1e6, 1e7 fp32 elements) and matmul (fp32, bf16).
  ratio = neuron throughput / CPU throughput, target >= 0.95.

Noise control: every measurement alternates CPU and neuron blocks (swapping which goes first
each round), repeats them, and reports medians; the garbage collector is off while timing.
Both devices run the same host kernels, so the ratio is about what the device adds, not about
threading: by default each side gets one intra-op thread (--threads), because on a small,
shared host a multi-threaded OpenMP region waits for a descheduled worker and the timings
collapse to multiples of the scheduler's time slice (seen as ~8 ms per 1e6-element add on
2 busy cores, for CPU and neuron alike).
The software NeuronCore executes ops synchronously on the calling thread, but each neuron
block still ends with torch.neuron.synchronize() so the figures stay right if streams become
asynchronous.

    python benchmarks/eager_dispatch.py            # full run (about a minute on 2 cores)
    python benchmarks/eager_dispatch.py --quick    # fewer sizes and repeats (~15 s)
    python benchmarks/eager_dispatch.py --markdown # also print the table as Markdown
    python benchmarks/eager_dispatch.py --threads 2  # both cores for each kernel
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

DISPATCH_TARGET = 1.3  # neuron time / CPU time, at most
THROUGHPUT_TARGET = 0.95  # neuron throughput / CPU throughput, at least

Op = Callable[[], object]


@dataclass
class Row:
    family: str  # "dispatch" or "throughput"
    op: str
    size: str
    cpu: float  # dispatch: µs per call; throughput: units per second
    neuron: float
    unit: str

    @property
    def ratio(self) -> float:
        return self.neuron / self.cpu

    @property
    def target(self) -> str:
        return f"<= {DISPATCH_TARGET}" if self.family == "dispatch" else f">= {THROUGHPUT_TARGET}"

    @property
    def passed(self) -> bool:
        if self.family == "dispatch":
            return self.ratio <= DISPATCH_TARGET
        return self.ratio >= THROUGHPUT_TARGET


def sync(device: str) -> None:
    if device == "neuron":
        torch.neuron.synchronize()


def time_block(fn: Op, iterations: int, device: str) -> float:
    """Seconds per call of ``fn`` over one block of ``iterations`` calls."""
    sync(device)
    start = time.perf_counter()
    for _ in range(iterations):
        fn()
    sync(device)
    return (time.perf_counter() - start) / iterations


def interleaved(
    fns: dict[str, Op], iterations: int, rounds: int, warmup: int = 1
) -> dict[str, float]:
    """Median seconds per call for each device, from alternating blocks after warm-up."""
    devices = list(fns)
    for _ in range(warmup):
        for device in devices:
            time_block(fns[device], iterations, device)
    samples: dict[str, list[float]] = {device: [] for device in devices}
    for r in range(rounds):
        order = devices if r % 2 == 0 else devices[::-1]
        for device in order:
            samples[device].append(time_block(fns[device], iterations, device))
    return {device: statistics.median(values) for device, values in samples.items()}


# --- dispatch overhead on tiny tensors -------------------------------------------------------


def tiny_ops(device: str) -> dict[str, tuple[str, Op]]:
    """name -> (size label, zero-argument call) on ``device``; inputs built once."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(4, 4, generator=g).to(device)
    b = torch.randn(4, 4, generator=g).to(device)
    v = torch.randn(8, generator=g).to(device)
    w = torch.randn(8, generator=g).to(device)
    add, mul, relu, mm, empty = torch.add, torch.mul, torch.relu, torch.matmul, torch.empty
    return {
        "add": ("4x4", lambda: add(a, b)),
        "mul": ("4x4", lambda: mul(a, b)),
        "relu": ("4x4", lambda: relu(a)),
        "sum": ("8", lambda: v.sum()),
        "matmul": ("4x4", lambda: mm(a, b)),
        "add_ (in place)": ("8", lambda: v.add_(w)),
        "view": ("4x4->16", lambda: a.view(16)),
        "empty": ("4x4", lambda: empty(4, 4, device=device)),
    }


def bench_dispatch(quick: bool) -> list[Row]:
    iterations = 1000 if quick else 3000
    rounds = 7 if quick else 15
    cpu_ops, neuron_ops = tiny_ops("cpu"), tiny_ops("neuron")
    rows = []
    for name, (size, cpu_fn) in cpu_ops.items():
        neuron_fn = neuron_ops[name][1]
        t = interleaved({"cpu": cpu_fn, "neuron": neuron_fn}, iterations, rounds)
        rows.append(Row("dispatch", name, size, t["cpu"] * 1e6, t["neuron"] * 1e6, "µs/call"))
    return rows


# --- throughput at large sizes ---------------------------------------------------------------


def calibrate(fn: Op, device: str, budget: float) -> int:
    """Calls per block so that one block takes about ``budget`` seconds."""
    per_call = time_block(fn, 1, device)
    return max(1, min(200, math.ceil(budget / max(per_call, 1e-9))))


def throughput_row(
    name: str, size: str, make: Callable[[str], Op], work: float, unit: str, quick: bool
) -> Row:
    """``work`` units per call; reports units per second for both devices."""
    fns = {"cpu": make("cpu"), "neuron": make("neuron")}
    budget = 0.03 if quick else 0.06
    iterations = calibrate(fns["cpu"], "cpu", budget)
    per_call = time_block(fns["cpu"], 1, "cpu")
    # Long calls average over many scheduler slices by themselves; fewer rounds keep the
    # bf16 GEMMs (seconds per call on hosts without bf16 units) affordable.
    rounds = 3 if per_call > 1.5 else 5 if (quick or per_call > 0.25) else 7
    t = interleaved(fns, iterations, rounds)
    del fns
    # Hand cached device segments back between rows, so one row's cache state (and any
    # growth of it) does not carry into the next row or inflate the process.
    torch.neuron.empty_cache()
    return Row("throughput", name, size, work / t["cpu"], work / t["neuron"], unit)


def elementwise(op: str, numel: int) -> Callable[[str], Op]:
    fn = {
        "add": torch.add,
        "mul": torch.mul,
        "gelu": torch.nn.functional.gelu,
        "exp": torch.exp,
        "add (out=)": torch.add,
    }[op]
    binary = op.startswith(("add", "mul"))
    into_out = op.endswith("(out=)")

    def make(device: str) -> Op:
        g = torch.Generator().manual_seed(1)
        x = torch.randn(numel, generator=g).to(device)
        y = torch.randn(numel, generator=g).to(device)
        if into_out:
            out = torch.empty(numel, device=device)
            return lambda: fn(x, y, out=out)
        return (lambda: fn(x, y)) if binary else (lambda: fn(x))

    return make


def matmul(n: int, dtype: torch.dtype) -> Callable[[str], Op]:
    def make(device: str) -> Op:
        g = torch.Generator().manual_seed(2)
        a = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
        b = torch.randn(n, n, generator=g).to(device=device, dtype=dtype)
        return lambda: torch.matmul(a, b)

    return make


def bench_throughput(quick: bool) -> list[Row]:
    rows = []
    sizes = (1_000_000,) if quick else (1_000_000, 10_000_000)
    for numel in sizes:
        label = f"{numel:.0e}".replace("+0", "")
        # "add (out=)" writes into a preallocated tensor: the same kernel without the
        # allocation of the result, which separates allocator cost from kernel throughput.
        for op in ("add", "mul", "gelu", "exp", "add (out=)"):
            rows.append(
                throughput_row(op, label, elementwise(op, numel), numel / 1e9, "Gelem/s", quick)
            )
    # bf16 GEMM on a host without AVX512-BF16/AMX runs a slow path (~40x fp32), so its sizes
    # are smaller to keep the run short.
    matmuls = [(1024, torch.float32), (512, torch.bfloat16)]
    if not quick:
        matmuls = [
            (1024, torch.float32),
            (2048, torch.float32),
            (512, torch.bfloat16),
            (1024, torch.bfloat16),
        ]
    for n, dtype in matmuls:
        name = f"matmul {str(dtype).removeprefix('torch.')}"
        rows.append(
            throughput_row(name, f"{n}x{n}", matmul(n, dtype), 2 * n**3 / 1e9, "GFLOP/s", quick)
        )
    return rows


# --- report ----------------------------------------------------------------------------------


def fmt(value: float) -> str:
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


def table(rows: list[Row], markdown: bool) -> str:
    header = ["op", "size", "cpu", "neuron", "ratio", "target", "pass/miss"]
    body = [
        [
            r.op,
            r.size,
            f"{fmt(r.cpu)} {r.unit}",
            f"{fmt(r.neuron)} {r.unit}",
            f"{r.ratio:.3f}",
            r.target,
            "pass" if r.passed else "MISS",
        ]
        for r in rows
    ]
    if markdown:
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(cells) + " |" for cells in body]
        return "\n".join(lines)
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(header, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) for cells in body]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repeats")
    parser.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="intra-op threads for both devices (default 1; 0 keeps torch's default)",
    )
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if not torch.neuron.is_available():
        print("no neuron device available", file=sys.stderr)
        return 2

    print(
        f"torch {torch.__version__}, {platform.machine()} {torch.get_num_threads()} threads, "
        f"CPU capability {torch.backends.cpu.get_cpu_capability()}, "
        f"neuron device: {torch.neuron.get_device_name()}",
        flush=True,
    )
    load = os.getloadavg()
    print(f"host: {os.cpu_count()} cores, load average {load[0]:.2f} at start", flush=True)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    start = time.perf_counter()
    try:
        print("measuring dispatch overhead on tiny tensors ...", flush=True)
        rows = bench_dispatch(args.quick)
        print("measuring throughput at large sizes ...", flush=True)
        rows += bench_throughput(args.quick)
    finally:
        if gc_was_enabled:
            gc.enable()
    elapsed = time.perf_counter() - start
    print()
    print(table(rows, markdown=False))
    if args.markdown:
        print()
        print(table(rows, markdown=True))
    missed = [r for r in rows if not r.passed]
    print()
    print(
        f"{len(rows) - len(missed)}/{len(rows)} within target; measured in {elapsed:.0f} s; "
        f"load average {os.getloadavg()[0]:.2f} at end"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
