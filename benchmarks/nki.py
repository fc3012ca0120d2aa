"""NKI sample-style kernels: compiled path vs interpreter vs the same math as PyTorch eager
on the CPU, at about 1e6 elements, and beside each the engine-level estimate of what one
NeuronCore of the target chip (NEURON_PLATFORM_TARGET_OVERRIDE, default trn2) would spend
where (``nki.estimate``).  Run: python -m benchmarks.nki [--repeat N]"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
import nki_sample_kernels as k  # noqa: E402


def _time(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _interleaved_best(fns, repeat):
    """Best time of each function, the runs interleaved so that each sees the same share
    of a shared host's quiet moments."""
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for n, fn in enumerate(fns):
            best[n] = min(best[n], _time(fn))
    return best


def _single_threaded(fn):
    def run():
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            fn()
        finally:
            torch.set_num_threads(threads)

    return run


def _cases():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4096, 256), dtype=np.float32)  # 1,048,576 elements
    w = rng.standard_normal(256, dtype=np.float32)
    gamma, beta = (
        rng.standard_normal(256, dtype=np.float32),
        rng.standard_normal(256, dtype=np.float32),
    )
    lhs_t = rng.standard_normal((1024, 1024), dtype=np.float32)
    rhs = rng.standard_normal((1024, 1024), dtype=np.float32)
    q = rng.standard_normal((1024, 128), dtype=np.float32)
    keys = rng.standard_normal((1024, 128), dtype=np.float32)
    v = rng.standard_normal((1024, 128), dtype=np.float32)
    tx, tw, tg, tb = map(torch.from_numpy, (x, w, gamma, beta))
    tl, tr, tq, tk, tv = map(torch.from_numpy, (lhs_t, rhs, q, keys, v))

    def torch_rms():
        return tx * torch.rsqrt(tx.pow(2).mean(-1, keepdim=True) + 1e-6) * tw

    return [
        ("rmsnorm 4096x256", k.rmsnorm_kernel, (x, w, 1e-6), torch_rms),
        (
            "layernorm 4096x256",
            k.layernorm_kernel,
            (x, gamma, beta, 1e-5),
            lambda: torch.nn.functional.layer_norm(tx, (256,), tg, tb, 1e-5),
        ),
        ("softmax 4096x256", k.softmax_kernel, (x,), lambda: torch.softmax(tx, -1)),
        ("tensor add 1024x1024", k.add_kernel[8, 2], (lhs_t, rhs), lambda: tl + tr),
        ("tiled matmul 1024^3", k.matmul_new_kernel, (lhs_t, rhs), lambda: tl.T @ tr),
        (
            "flash attention fwd 1024x1024x128",
            k.flash_attention_kernel,
            (q.T.copy(), keys.T.copy(), v, 128**-0.5),
            lambda: torch.softmax((tq @ tk.T) * 128**-0.5, -1) @ tv,
        ),
    ]


def _with_mode(mode, fn):
    """fn run with TORCHNEURON_NKI_ROW_PROGRAMS=mode (the kernel cache keys on the mode)."""

    def run():
        previous = os.environ.get("TORCHNEURON_NKI_ROW_PROGRAMS")
        os.environ["TORCHNEURON_NKI_ROW_PROGRAMS"] = mode
        try:
            return fn()
        finally:
            if previous is None:
                del os.environ["TORCHNEURON_NKI_ROW_PROGRAMS"]
            else:
                os.environ["TORCHNEURON_NKI_ROW_PROGRAMS"] = previous

    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    import torchneuron
    import torchneuron.nki as nki

    host = torchneuron._C._kernel_isa()
    threads = torch.get_num_threads()
    print(f"CPU: {host['model']}, ISA {host['isa']}; load average {os.getloadavg()[0]:.2f}")
    print(
        f"torch threads: {threads} (row programs of >= 2^15 elements and torch.mm use them; "
        "eager-1t is eager on 1 thread)"
    )
    print("compiled = default (C++ row programs + numpy/torch.mm); numpy = the numpy program")
    header = ("kernel", "compiled", "numpy", "interp", "eager", "eager-1t", "c/eager", "c/eager-1t")
    print(f"{header[0]:36}" + "".join(f"{h:>11}" for h in header[1:]))
    estimates = []
    launches = []
    for name, kernel, inputs, eager in _cases():
        compiled = _with_mode("auto", lambda kernel=kernel, inputs=inputs: kernel(*inputs))
        numpy_program = _with_mode("never", lambda kernel=kernel, inputs=inputs: kernel(*inputs))
        compiled()  # trace + compile once per mode
        numpy_program()
        best = _interleaved_best([compiled, numpy_program, eager], args.repeat)
        # apart: each switch of the thread count resizes the OpenMP team (and empties
        # oneDNN's cache), which the call after the switch back would pay for
        best += _interleaved_best([_single_threaded(eager)], args.repeat)
        (interp,) = _interleaved_best(
            [lambda kernel=kernel, inputs=inputs: kernel.interpret(*inputs)],
            max(1, args.repeat // 3),
        )
        ms = [best[0], best[1], interp, best[2], best[3]]
        print(
            f"{name:36}"
            + "".join(f"{t * 1e3:11.3f}" for t in ms)
            + f"{best[0] / best[2]:10.2f}x{best[0] / best[3]:10.2f}x"
        )
        estimates.append((name, nki.estimate(kernel, *inputs), best[0]))
        launches.append((name, *_launch_split(compiled, kernel, args.repeat)))
    print(f"load average at end {os.getloadavg()[0]:.2f}")
    _print_launches(launches)
    _print_estimates(estimates)


def _launch_split(call, kernel, repeat: int) -> tuple[float, float, float]:  # noqa: ANN001
    """(best call, the program within it, median launch): a compiled call timed whole, and
    the part its program ran (Kernel.last_program_s); the launch is the rest (arguments,
    cache lookup, outputs, and Python running with caches the program evicted)."""
    samples = []
    for _ in range(repeat):
        total = _time(call)
        samples.append((total, kernel.last_program_s))
    best = min(samples)
    launches = sorted(total - program for total, program in samples)
    return best[0], best[1], launches[len(launches) // 2]


def _print_launches(launches) -> None:  # noqa: ANN001
    print("\nwhere a compiled call's time goes (ms; launch = the call minus its program)")
    header = ("kernel", "call", "program", "launch")
    print(f"{header[0]:36}" + "".join(f"{h:>11}" for h in header[1:]))
    for name, total, program, launch in launches:
        print(f"{name:36}{total * 1e3:11.3f}{program * 1e3:11.3f}{launch * 1e3:11.3f}")


def _print_estimates(estimates) -> None:  # noqa: ANN001
    """Per kernel: the host's compiled time beside the estimate on one NeuronCore, per engine
    (engines overlapping perfectly, the busiest bounds it)."""
    engines = ("tensor", "vector", "scalar", "gpsimd", "dma")
    chip = estimates[0][1].chip if estimates else "?"
    print(f"\nestimate on one {chip} NeuronCore (us), beside the host's compiled time (ms)")
    header = ("kernel", "host ms", "chip us", "bound", *engines, "MFLOP", "HBM MiB")
    print(f"{header[0]:36}" + "".join(f"{h:>9}" for h in header[1:]))
    for name, cost, host_s in estimates:
        cells = [f"{host_s * 1e3:9.3f}", f"{cost.estimated_s * 1e6:9.1f}", f"{cost.bound:>9}"]
        cells += [f"{cost.engine_seconds.get(e, 0.0) * 1e6:9.1f}" for e in engines]
        cells += [f"{cost.matmul_flops / 1e6:9.1f}", f"{cost.hbm_bytes / 2**20:9.2f}"]
        print(f"{name:36}" + "".join(cells))


if __name__ == "__main__":
    main()
