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


def _best(fn, repeat):
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


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
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"torch threads: {torch.get_num_threads()}")
    header = ("kernel", "compiled ms", "interp ms", "eager ms", "compiled/eager")
    print(f"{header[0]:36} {header[1]:>12} {header[2]:>10} {header[3]:>9} {header[4]:>15}")
    for name, kernel, inputs, eager in _cases():
        kernel(*inputs)  # trace + compile once
        compiled = _best(lambda kernel=kernel, inputs=inputs: kernel(*inputs), args.repeat)
        interp = _best(
            lambda kernel=kernel, inputs=inputs: kernel.interpret(*inputs), max(1, args.repeat // 2)
        )
        ref = _best(eager, args.repeat)
        ratio = compiled / ref
        print(
            f"{name:36} {compiled * 1e3:12.2f} {interp * 1e3:10.2f} {ref * 1e3:9.2f} {ratio:15.2f}x"
        )


if __name__ == "__main__":
    main()
