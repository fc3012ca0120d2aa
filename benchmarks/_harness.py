"""Timing and reporting shared by the benchmarks: interleaved device blocks, medians, tables.

Every benchmark here reports a ratio against a baseline measured in the same run, because
absolute times on a small shared host mean little. The helpers alternate baseline and
neuron blocks (swapping which runs first each round) and take medians, so load that comes
and goes hits both sides alike.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

Op = Callable[[], object]


def sync(device: str) -> None:
    """Wait for queued work on ``device`` (a no-op for CPU); "neuron ..." labels count."""
    if device.startswith("neuron"):
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
    """Median seconds per call for each device, from alternating blocks after warm-up.

    The keys of ``fns`` label what each function runs; a label starting with "neuron" is
    synchronised with the device after each block.
    """
    devices = list(fns)
    for _ in range(warmup):
        for device in devices:
            use_threads(device)
            time_block(fns[device], iterations, device)
    samples: dict[str, list[float]] = {device: [] for device in devices}
    for r in range(rounds):
        order = devices if r % 2 == 0 else devices[::-1]
        for device in order:
            use_threads(device)
            samples[device].append(time_block(fns[device], iterations, device))
    return {device: statistics.median(values) for device, values in samples.items()}


def calibrate(fn: Op, device: str, budget: float, most: int = 200) -> int:
    """Calls per block so that one block takes about ``budget`` seconds."""
    per_call = time_block(fn, 1, device)
    return max(1, min(most, math.ceil(budget / max(per_call, 1e-9))))


def rounds_for(per_call: float, quick: bool) -> int:
    """Fewer rounds for long calls: they average over many scheduler slices by themselves."""
    if per_call > 1.5:
        return 3
    if quick or per_call > 0.25:
        return 5
    return 7


def set_threads(threads: int) -> None:
    """Intra-op threads for both devices (0 keeps torch's default)."""
    if threads > 0:
        torch.set_num_threads(threads)


# Intra-op threads per side ("cpu", "neuron"), from --threads and --cpu-threads.
_THREADS: dict[str, int] = {}


def use_threads(label: str) -> None:
    """Sets the intra-op threads of the side that `label` ("cpu..." or "neuron...") runs."""
    threads = _THREADS.get("neuron" if label.startswith("neuron") else "cpu", 0)
    if threads > 0 and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def parse_and_start(
    description: str,
    quick_help: str,
    argv: list[str] | None,
    more_options: Callable[[argparse.ArgumentParser], None] | None = None,
) -> Any:
    """The options every device benchmark takes (--quick, --markdown, --threads), plus those
    `more_options` adds: parses them, sets the threads, prints the host banner. None (after
    saying why) without a device."""
    parser = argparse.ArgumentParser(description=description)
    if more_options is not None:
        more_options(parser)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    parser.add_argument(
        "--threads", type=int, default=1, help="intra-op threads (default 1; 0: torch's default)"
    )
    parser.add_argument(
        "--cpu-threads",
        type=int,
        default=None,
        help="intra-op threads of the CPU eager side only (default: --threads). With "
        "asynchronous launches neuron's stream worker is a second busy thread, so "
        "--threads 1 --cpu-threads 2 compares equal core budgets on 2 cores",
    )
    args = parser.parse_args(argv)
    if args.cpu_threads is None:
        args.cpu_threads = args.threads
    set_threads(args.threads)
    _THREADS.update(cpu=args.cpu_threads, neuron=args.threads)
    if not torch.neuron.is_available():
        print("no neuron device available", file=sys.stderr)
        return None
    print(host_banner(), flush=True)
    return args


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No garbage-collector pauses inside the timed region."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def print_table(table: Table, markdown: bool) -> None:
    print()
    print(table.text())
    if markdown:
        print()
        print(table.markdown())


def host_banner() -> str:
    """One line naming torch, the host (CPU model, the ISA of PyTorch's and of our kernels)
    and its load, printed at the top of every run."""
    import torchneuron

    kernels = torchneuron._C._kernel_isa()
    return (
        f"torch {torch.__version__}, {platform.machine()} {kernels['model']!r}, "
        f"{os.cpu_count()} cores, {_threads_text()}, "
        f"CPU capability {torch.backends.cpu.get_cpu_capability()}, "
        f"native kernels {kernels['isa']}, "
        f"neuron device: {torch.neuron.get_device_name()}, "
        f"{_launch_mode()}, "
        f"load average {os.getloadavg()[0]:.2f}"
    )


def _threads_text() -> str:
    cpu, neuron = _THREADS.get("cpu", 0), _THREADS.get("neuron", 0)
    if cpu and neuron and cpu != neuron:
        return f"intra-op threads: CPU eager {cpu}, neuron {neuron}"
    return f"{torch.get_num_threads()} intra-op threads"


def _launch_mode() -> str:
    """How neuron ops launch in this run (csrc/aten/launch/async_launch.h)."""
    import torchneuron

    if torchneuron._C._launch_blocking():
        return "blocking launches (NEURON_LAUNCH_BLOCKING=1)"
    threshold = os.environ.get("TORCHNEURON_ASYNC_MIN_BYTES", "262144")
    return f"asynchronous launches (from {threshold} bytes)"


def geomean(values: Sequence[float]) -> float:
    """Geometric mean: the right average of ratios (a 2x and a 0.5x cancel out)."""
    return math.exp(sum(math.log(v) for v in values) / len(values))


def fmt(value: float) -> str:
    """Three significant digits, or a whole number from 100 up."""
    return f"{value:.3g}" if value < 100 else f"{value:.0f}"


@dataclass
class Table:
    """Rows of string cells rendered as aligned text or Markdown."""

    header: Sequence[str]
    body: list[Sequence[str]]

    def text(self) -> str:
        rows = [self.header, *self.body]
        widths = [max(len(row[i]) for row in rows) for i in range(len(self.header))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(self.header, widths, strict=True))]
        lines.append("  ".join("-" * w for w in widths))
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in self.body]
        return "\n".join(lines)

    def markdown(self) -> str:
        lines = ["| " + " | ".join(self.header) + " |", "|" + "---|" * len(self.header)]
        lines += ["| " + " | ".join(cells) + " |" for cells in self.body]
        return "\n".join(lines)
