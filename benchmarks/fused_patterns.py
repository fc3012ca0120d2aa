"""Room left for a native kernel in compiled graphs: Inductor's code for Llama's fused
patterns against a copy of the same bytes.

A pattern with no single aten op in Hugging Face eager code (LlamaRMSNorm's
pow/mean/rsqrt/mul, rotary embedding, silu(gate) * up) reaches a native kernel under
torch.compile(backend="neuron") only through a graph rewrite, which also cuts the pattern
out of Inductor's fusion with its neighbours. It pays only if Inductor's generated C++ is
well below the memory bound. This prints, per pattern, shape and dtype:

    CPU eager time, Inductor (torch.compile on the CPU; backend="neuron" compiles the same
    C++), and the time of `torch.add(a, b, out=c)` over the pattern's bytes read and written
    (a streaming kernel at memory speed): "bound" = copy time / Inductor time (1.0: at the
    memory bound, nothing left for a hand-written kernel). A last row does the same for
    the CPU's fused AdamW step against eager (no Inductor).

    python benchmarks/fused_patterns.py [--threads N] [--quick]
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
from _harness import Table, calibrate, fmt, gc_paused, interleaved, parse_and_start, print_table


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # LlamaRMSNorm.forward
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    return w * h.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return q * cos + rotate_half(q) * sin


def gated(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


def cases(dtype: torch.dtype) -> list[tuple[str, str, Callable[[], object], tuple, int]]:
    """(pattern, shape, eager fn, args, bytes moved)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for rows, hidden in ((512, 512), (64, 768)):
        x = torch.randn(rows, hidden, generator=g).to(dtype)
        w = torch.ones(hidden, dtype=dtype)
        out.append(("rms_norm", f"{rows}x{hidden}", rms_norm, (x, w), 2 * x.nbytes))
    for batch, heads, seq in ((4, 8, 128), (1, 12, 64)):
        q = torch.randn(batch, heads, seq, 64, generator=g).to(dtype)
        cos = torch.randn(batch, 1, seq, 64, generator=g).to(dtype)
        sin = torch.randn(batch, 1, seq, 64, generator=g).to(dtype)
        out.append(("rope", f"{batch}x{heads}x{seq}x64", rope, (q, cos, sin), 2 * q.nbytes))
    for rows, inter in ((512, 1408), (64, 2048)):
        a = torch.randn(rows, inter, generator=g).to(dtype)
        b = torch.randn(rows, inter, generator=g).to(dtype)
        out.append(("silu*up", f"{rows}x{inter}", gated, (a, b), 3 * a.nbytes))
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_and_start(__doc__.splitlines()[0], "fewer repeats", argv)
    if args is None:
        return 1
    rounds = 5 if args.quick else 9
    table = Table(["pattern", "shape", "dtype", "eager us", "inductor us", "copy us", "bound"], [])
    for dtype in (torch.float32, torch.bfloat16):
        for name, shape, fn, inputs, nbytes in cases(dtype):
            compiled = torch.compile(fn, dynamic=False)
            compiled(*inputs)
            # A streaming add over the same bytes: reads two thirds, writes one third.
            n = max(1, nbytes // 3 // 4)
            a, b, c = torch.randn(n), torch.randn(n), torch.empty(n)
            fns = {
                "eager": lambda fn=fn, inputs=inputs: fn(*inputs),
                "inductor": lambda compiled=compiled, inputs=inputs: compiled(*inputs),
                "copy": lambda a=a, b=b, c=c: torch.add(a, b, out=c),
            }
            iterations = calibrate(fns["eager"], "cpu", 0.02)
            with gc_paused():
                seconds = interleaved(fns, iterations, rounds)
            row = [
                name,
                shape,
                str(dtype).removeprefix("torch."),
                fmt(seconds["eager"] * 1e6),
                fmt(seconds["inductor"] * 1e6),
                fmt(seconds["copy"] * 1e6),
                f"{seconds['copy'] / seconds['inductor']:.2f}",
            ]
            table.body.append(row)
            print("  " + "  ".join(row), flush=True)
    table.body += adamw_rows(rounds)
    print("  " + "  ".join(table.body[-1]), flush=True)
    print_table(table, args.markdown)
    return 0


def adamw_rows(rounds: int) -> list[list[str]]:
    """The CPU's fused AdamW step (what Trainer's adamw_torch_fused runs) on 4M float32
    parameters: reads param, grad, exp_avg, exp_avg_sq; writes three of them back."""
    n = 4 * 2**20
    params = [torch.randn(n)]
    grads = [torch.randn(n)]
    exp_avgs, exp_avg_sqs = [torch.zeros(n)], [torch.zeros(n)]
    steps = [torch.tensor(1.0)]

    def step() -> None:
        torch._fused_adamw_(
            params,
            grads,
            exp_avgs,
            exp_avg_sqs,
            [],
            steps,
            lr=1e-4,
            beta1=0.9,
            beta2=0.999,
            weight_decay=0.01,
            eps=1e-8,
            amsgrad=False,
            maximize=False,
        )

    m = 7 * n // 3
    a, b, c = torch.randn(m), torch.randn(m), torch.empty(m)
    fns = {"eager": step, "copy": lambda: torch.add(a, b, out=c)}
    with gc_paused():
        seconds = interleaved(fns, calibrate(step, "cpu", 0.05), rounds)
    return [
        [
            "_fused_adamw_",
            f"{n}",
            "float32",
            fmt(seconds["eager"] * 1e6),
            "-",
            fmt(seconds["copy"] * 1e6),
            f"{seconds['copy'] / seconds['eager']:.2f}",
        ]
    ]


if __name__ == "__main__":
    sys.exit(main())
