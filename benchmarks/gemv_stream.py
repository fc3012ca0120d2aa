"""GEMV streaming rate: how fast a decode step's matrix-vector products read their weights.

A batch-1 decode step reads every weight once, so its GEMVs should stream the weights at the
host's memory bandwidth. For each weight matrix of a 100M Llama (hidden 768, intermediate
2048, vocabulary 32000), float32 and bfloat16, one product `x @ W.T` with x one row:
neuron (the native GEMV) and CPU eager on the same inputs, as bytes of W per second, against
the read bandwidth a streaming `sum` reaches in the same run (hf_generate.py's measure).
Each call reads a different copy of W (copies spanning at least 128 MiB, 4x this host's L3),
so the weights come from memory as in a model, where the other layers' weights pass between
reuses. Blocks of calls alternate between the devices; medians are compared.

    python benchmarks/gemv_stream.py            # 1 intra-op thread
    python benchmarks/gemv_stream.py --threads 2
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
from _harness import Table, fmt, gc_paused, interleaved, parse_and_start, print_table
from hf_generate import read_bandwidth

SHAPES = {  # (rows of W, columns of W): output features × input features
    "attn q/o": (768, 768),
    "attn k/v": (256, 768),
    "mlp up/gate": (2048, 768),
    "mlp down": (768, 2048),
    "lm head": (32000, 768),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
SPAN = 128 * 2**20  # bytes of weight copies cycled through per device


@dataclass
class Row:
    layer: str
    dtype: str
    shape: tuple[int, int]
    cpu: float  # bytes of W per second
    neuron: float


def cycling(weights: list[torch.Tensor], x: torch.Tensor):  # noqa: ANN201 - a closure
    """One product per call, each call on the next copy of W."""
    state = {"i": 0}

    def step() -> torch.Tensor:
        w = weights[state["i"] % len(weights)]
        state["i"] += 1
        return torch.nn.functional.linear(x, w)

    return step


def measure(layer: str, dtype: torch.dtype, shape: tuple[int, int], quick: bool) -> Row:
    g = torch.Generator().manual_seed(0)
    base = torch.randn(shape, generator=g).to(dtype)
    x = torch.randn(1, shape[1], generator=g).to(dtype)
    copies = max(2, SPAN // base.nbytes)
    fns = {}
    for device in ("cpu", "neuron"):
        weights = [base.to(device) if device == "neuron" else base.clone() for _ in range(copies)]
        fns[device] = cycling(weights, x.to(device))
    torch.testing.assert_close(fns["neuron"]().cpu(), fns["cpu"](), rtol=2e-2, atol=2e-2)
    seconds = interleaved(fns, copies, 3 if quick else 7)
    name = next(k for k, v in DTYPES.items() if v == dtype)
    return Row(layer, name, shape, base.nbytes / seconds["cpu"], base.nbytes / seconds["neuron"])


def main(argv: list[str] | None = None) -> int:
    args = parse_and_start(__doc__.split("\n")[0], "3 rounds instead of 7", argv)
    if args is None:
        return 2
    bandwidth = read_bandwidth()
    print(f"measured read bandwidth (sum over 512 MiB): {bandwidth / 1e9:.1f} GB/s", flush=True)
    rows = []
    with gc_paused():
        for dtype in DTYPES.values():
            for layer, shape in SHAPES.items():
                row = measure(layer, dtype, shape, args.quick)
                rows.append(row)
                print(
                    f"{row.dtype} {layer} {shape[0]}x{shape[1]}: cpu {row.cpu / 1e9:.1f} GB/s, "
                    f"neuron {row.neuron / 1e9:.1f} GB/s",
                    flush=True,
                )
    header = ["dtype", "layer", "W", "cpu GB/s", "neuron GB/s", "neuron/cpu", "neuron/bandwidth"]
    body = [
        [
            r.dtype,
            r.layer,
            f"{r.shape[0]}x{r.shape[1]}",
            fmt(r.cpu / 1e9),
            fmt(r.neuron / 1e9),
            f"{r.neuron / r.cpu:.2f}",
            f"{r.neuron / bandwidth:.2f}",
        ]
        for r in rows
    ]
    print_table(Table(header, body), args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
