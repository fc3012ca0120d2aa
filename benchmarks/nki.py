"""NKI sample-style kernels: compiled path vs interpreter vs the same math as PyTorch eager
on the CPU, at about 1e6 elements.  Run: python -m benchmarks.nki [--repeat N]"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    threads = torch.get_num_threads()
    print(f"torch threads: {threads} (kernels run single-threaded; eager-1t is eager on 1 thread)")
    header = ("kernel", "compiled ms", "interp ms", "eager ms", "eager-1t ms", "comp/eager")
    print(
        f"{header[0]:36} {header[1]:>12} {header[2]:>10} {header[3]:>9} {header[4]:>12} "
        f"{header[5]:>11}"
    )
    for name, kernel, inputs, eager in _cases():
        kernel(*inputs)  # trace + compile once
        compiled, ref, ref1 = _interleaved_best(
            [
                lambda kernel=kernel, inputs=inputs: kernel(*inputs),
                eager,
                _single_threaded(eager),
            ],
            args.repeat,
        )
        (interp,) = _interleaved_best(
            [lambda kernel=kernel, inputs=inputs: kernel.interpret(*inputs)],
            max(1, args.repeat // 3),
        )
        ratio = compiled / ref
        print(
            f"{name:36} {compiled * 1e3:12.2f} {interp * 1e3:10.2f} {ref * 1e3:9.2f} "
            f"{ref1 * 1e3:12.2f} {ratio:10.2f}x"
        )


if __name__ == "__main__":
    main()
