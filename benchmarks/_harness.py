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


def time_block(
    fn: Op, iterations: int, device: str, clock: Callable[[], float] = time.perf_counter
) -> float:
    """Seconds per call of ``fn`` over one block of ``iterations`` calls."""
    sync(device)
    start = clock()
    for _ in range(iterations):
        fn()
    sync(device)
    return (clock() - start) / iterations


# The device's own threads: the stream workers (csrc/runtime/stream.h names them).
DEVICE_THREAD_NAME = "neuron-stream"
# Blocks of one label whose slowest is more than this times its fastest disagree: they are
# measured again, and a label whose blocks still disagree is reported as unstable.
SPREAD_LIMIT = 1.5
# A baseline block during which the device's threads ran longer than this share of the
# block's time (and more than two clock ticks, the resolution of the kernel's count) is
# discarded and measured again.
DEVICE_CPU_LIMIT = 0.02
_TICK = 1.0 / os.sysconf("SC_CLK_TCK")


def device_thread_cpu() -> float:
    """CPU seconds the device's threads in this process have used (user + system)."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() != DEVICE_THREAD_NAME:
                    continue
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total * _TICK


class Medians(dict[str, float]):
    """Median seconds per call by label, and why a label's figure is not to be trusted.

    ``unstable[label]`` is the spread (slowest block / fastest) of a label whose blocks
    disagreed beyond SPREAD_LIMIT even when measured again; ``disturbed[label]`` the CPU
    seconds the device's threads ran during a baseline block that stayed disturbed after
    three tries. A ratio involving either is not a measurement (``ratio_text``).
    """

    def __init__(self, medians: dict[str, float]) -> None:
        super().__init__(medians)
        self.unstable: dict[str, float] = {}
        self.disturbed: dict[str, float] = {}

    def doubt(self, label: str) -> str | None:
        """Why `label`'s median is not a measurement, or None."""
        if label in self.disturbed:
            return f"{label}: device threads ran {self.disturbed[label]:.2f} s in its block"
        if label in self.unstable:
            return f"{label}: blocks {self.unstable[label]:.2f}x apart"
        return None

    def ratio_text(self, numerator: str, denominator: str, digits: int = 3) -> str:
        """seconds[numerator] / seconds[denominator], or "unstable" when either is doubtful."""
        if self.doubt(numerator) or self.doubt(denominator):
            return "unstable"
        return f"{self[numerator] / self[denominator]:.{digits}f}"


def _baseline_block(
    fn: Op, iterations: int, label: str, clock: Callable[[], float]
) -> tuple[float, float]:
    """(seconds per call, device-thread CPU seconds beyond the limit or 0) of one baseline
    block, measured again (up to three tries) while the device's threads ran during it."""
    extra = 0.0
    for _ in range(3):
        before = device_thread_cpu()
        seconds = time_block(fn, iterations, label, clock)
        ran = device_thread_cpu() - before
        extra = ran if ran > max(2 * _TICK, DEVICE_CPU_LIMIT * seconds * iterations) else 0.0
        if not extra:
            break
    return seconds, extra


def interleaved(
    fns: dict[str, Op],
    iterations: int,
    rounds: int,
    warmup: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> Medians:
    """Median seconds per call for each label, from alternating blocks after warm-up.

    The keys of ``fns`` label what each function runs; a label starting with "neuron" is
    synchronised with the device after each block, any other is a baseline, during whose
    blocks the device's threads must not run (a block where they did is measured again).
    Labels whose blocks disagree by more than SPREAD_LIMIT are measured for as many rounds
    again; the result says which labels stayed unstable or disturbed (``Medians``).
    """
    devices = list(fns)
    for _ in range(warmup):
        for device in devices:
            use_threads(device)
            time_block(fns[device], iterations, device, clock)

    def measure() -> tuple[dict[str, list[float]], dict[str, float]]:
        samples: dict[str, list[float]] = {device: [] for device in devices}
        disturbed: dict[str, float] = {}
        for r in range(rounds):
            order = devices if r % 2 == 0 else devices[::-1]
            for device in order:
                use_threads(device)
                if device.startswith("neuron"):
                    samples[device].append(time_block(fns[device], iterations, device, clock))
                    continue
                seconds, extra = _baseline_block(fns[device], iterations, device, clock)
                samples[device].append(seconds)
                if extra:
                    disturbed[device] = max(extra, disturbed.get(device, 0.0))
        return samples, disturbed

    def spread(values: list[float]) -> float:
        return max(values) / max(min(values), 1e-12)

    samples, disturbed = measure()
    if any(spread(v) > SPREAD_LIMIT for v in samples.values()):
        again, disturbed_again = measure()
        for device in devices:
            samples[device] += again[device]
        disturbed.update(disturbed_again)
        wide = {d: spread(again[d]) for d in devices if spread(again[d]) > SPREAD_LIMIT}
    else:
        wide = {}
    result = Medians({device: statistics.median(values) for device, values in samples.items()})
    result.unstable = wide
    result.disturbed = disturbed
    for device in devices:
        if reason := result.doubt(device):
            print(f"  warning: not a measurement: {reason}", file=sys.stderr, flush=True)
    return result


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
