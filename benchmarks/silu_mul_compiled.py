"""silu(gate) * up compiled: Inductor on the CPU vs torch.compile(backend="neuron").

With ``TORCHNEURON_COMPILE_REWRITES=1`` the neuron backend rewrites the pair to
``torchneuron::silu_mul`` (our kernel, torchneuron/compile/rewrites.py); without it the
neuron graph runs Inductor's own C++ for the pair, like the CPU side. Both sides run in one
process, 50-call blocks alternating, 3 rounds of 7 blocks, medians (microseconds per call).

    TORCHNEURON_COMPILE_REWRITES=1 python benchmarks/silu_mul_compiled.py
    python benchmarks/silu_mul_compiled.py
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

import torchneuron
from torchneuron.compile.rewrites import rewrite_counters


def gated(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.silu(a) * b


def block_us(fn: Callable[[], object], calls: int = 50) -> float:
    fn()
    samples = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.neuron.synchronize()
        samples.append((time.perf_counter() - start) / calls)
    return statistics.median(samples) * 1e6


def main() -> int:
    torch.set_num_threads(1)
    isa = torchneuron._C._kernel_isa()
    print(f"CPU model: {isa['model']}; kernel ISA: {isa['isa']}; 1 intra-op thread")
    for dtype in (torch.float32, torch.bfloat16):
        for shape in ((512, 1408), (64, 2048)):
            a, b = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
            a_dev, b_dev = a.to("neuron"), b.to("neuron")
            inductor = torch.compile(gated, dynamic=False)
            neuron = torch.compile(gated, backend="neuron", dynamic=False)
            times: dict[str, list[float]] = {"inductor": [], "neuron": []}
            run_cpu = lambda fn=inductor, a=a, b=b: fn(a, b)  # noqa: E731
            run_dev = lambda fn=neuron, a=a_dev, b=b_dev: fn(a, b)  # noqa: E731
            for _ in range(3):
                times["inductor"].append(block_us(run_cpu))
                times["neuron"].append(block_us(run_dev))
            med = {k: statistics.median(v) for k, v in times.items()}
            print(
                f"{str(dtype).removeprefix('torch.')} {shape}: inductor {med['inductor']:.0f} us, "
                f"neuron {med['neuron']:.0f} us, ratio {med['inductor'] / med['neuron']:.2f}, "
                f"rewrites so far {rewrite_counters()['silu_mul']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
