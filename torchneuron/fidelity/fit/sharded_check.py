"""Traced layouts against the device: predicted and measured peak per rank.

``python -m torchneuron.fidelity.fit.sharded_check`` traces every rank of each layout in this
process (``sharded.predict_sharded``: fake process group, fake tensors), then runs the same
model, step and layout under torchrun on ``neuron`` (one job per world size, the layouts one
after another in it) where each rank reports ``torch.neuron.max_memory_allocated`` over its
step, and prints both with the relative error. Under torchrun this module is the worker
(``--worker``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass

from .layout import Layout
from .step import StepSpec

# The layouts checked by default (tests/test_fit_sharded.py): every way of sharding the
# traced path knows, on 2 and 4 ranks.
DEFAULT_LAYOUTS = (
    Layout(fsdp=2),
    Layout(tp=2),
    Layout(dp=2),
    Layout(tp=2, fsdp=2),
    Layout(fsdp=2, dp=2),
)
_MARK = "SHARDED_CHECK "
_RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class RankCheck:
    """One rank of one layout: the traced prediction and the device's measurement."""

    layout: Layout
    rank: int
    predicted: int
    measured: int

    @property
    def error(self) -> float:
        return (self.predicted - self.measured) / self.measured


def layout_name(layout: Layout) -> str:
    parts = [
        f"{n}{getattr(layout, n)}" for n in ("pp", "dp", "fsdp", "tp") if getattr(layout, n) > 1
    ]
    return "x".join(parts) or "single"


def parse_layout(text: str) -> Layout:
    """'tp2xfsdp2' -> Layout(tp=2, fsdp=2)."""
    sizes: dict[str, int] = {}
    for part in text.split("x"):
        name = part.rstrip("0123456789")
        if name not in ("tp", "fsdp", "dp", "pp") or name == part:
            raise ValueError(f"bad layout part {part!r} in {text!r}: use e.g. tp2xfsdp2")
        sizes[name] = int(part[len(name) :])
    return Layout(**sizes)


def _spec_arguments(spec: StepSpec) -> list[str]:
    return [
        f"--batch={spec.batch}",
        f"--seq={spec.seq}",
        f"--dtype={spec.dtype}",
        f"--optimizer={spec.optimizer}",
    ]


def measure_layouts(
    model: str, spec: StepSpec, layouts: list[Layout], timeout_s: float = 600
) -> dict[tuple[str, int], int]:
    """(layout name, rank) -> measured peak, from one torchrun job per world size."""
    measured: dict[tuple[str, int], int] = {}
    by_size: dict[int, list[Layout]] = {}
    for layout in layouts:
        by_size.setdefault(layout.cores, []).append(layout)
    for size, group in sorted(by_size.items()):
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={size}",
            "-m",
            "torchneuron.fidelity.fit.sharded_check",
            "--worker",
            model,
            *_spec_arguments(spec),
            "--layouts",
            ",".join(layout_name(lay) for lay in group),
        ]
        out, err, code = _run_job(argv, timeout_s)
        lines = [ln[len(_MARK) :] for ln in out.splitlines() if ln.startswith(_MARK)]
        if code != 0 or not lines:
            raise RuntimeError(f"{' '.join(argv)} exited {code}\n{out[-3000:]}\n{err[-6000:]}")
        for line in lines:
            row = json.loads(line)
            measured[(row["layout"], row["rank"])] = row["peak"]
    return measured


def _run_job(argv: list[str], timeout_s: float) -> tuple[str, str, int]:
    """Runs a torchrun job in its own session; on timeout its ranks are killed with it."""
    env = {k: v for k, v in os.environ.items() if k not in _RANK_VARIABLES}
    process = subprocess.Popen(
        argv,
        env=env,
        text=True,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        err += f"\n(killed after {timeout_s} s)"
    return out, err, process.returncode


def check_layouts(
    model: str = "tiny-llama", spec: StepSpec | None = None, layouts: list[Layout] | None = None
) -> list[RankCheck]:
    """Predicted and measured peak of every rank of every layout."""
    from .model_source import load_config
    from .sharded import predict_sharded

    spec = spec or StepSpec(batch=2, seq=128)
    chosen = list(layouts or DEFAULT_LAYOUTS)
    config = load_config(model)
    measured = measure_layouts(model, spec, chosen)
    rows = []
    for layout in chosen:
        for rank in range(layout.cores):
            predicted = predict_sharded(config, spec, layout, rank).peak_bytes
            rows.append(RankCheck(layout, rank, predicted, measured[(layout_name(layout), rank)]))
    return rows


def format_table(rows: list[RankCheck]) -> str:
    lines = [f"{'layout':<14}{'rank':>5}{'predicted (B)':>16}{'measured (B)':>16}{'error':>10}"]
    for r in rows:
        lines.append(
            f"{layout_name(r.layout):<14}{r.rank:>5}{r.predicted:>16,}{r.measured:>16,}"
            f"{r.error:>+10.3%}"
        )
    return "\n".join(lines)


def _worker(model: str, spec: StepSpec, layouts: list[Layout]) -> None:
    """One torchrun rank: each layout's step for real; rank 0 prints every rank's peak."""
    import torch
    import torch.distributed as dist

    import torchneuron  # noqa: F401 - registers the neuron device and process-group backend

    from .model_source import load_config
    from .sharded import measure_sharded

    torch.set_num_threads(1)
    dist.init_process_group("neuron")
    config = load_config(model)
    try:
        for layout in layouts:
            result = measure_sharded(config, spec, layout)
            every: list[dict[str, int] | None] = [None] * dist.get_world_size()
            dist.all_gather_object(every, result)
            if dist.get_rank() == 0:
                for rank, got in enumerate(every):
                    row = {"layout": layout_name(layout), "rank": rank, **(got or {})}
                    print(_MARK + json.dumps(row), flush=True)
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchneuron.fidelity.fit.sharded_check")
    p.add_argument("model", nargs="?", default="tiny-llama")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"))
    p.add_argument("--optimizer", default="adamw", choices=("adamw", "sgd"))
    p.add_argument(
        "--layouts",
        default=",".join(layout_name(lay) for lay in DEFAULT_LAYOUTS),
        help="comma-separated, e.g. fsdp2,tp2,tp2xfsdp2 (at most 4 ranks each here)",
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    spec = StepSpec(batch=a.batch, seq=a.seq, dtype=a.dtype, optimizer=a.optimizer)
    layouts = [parse_layout(t) for t in a.layouts.split(",")]
    if a.worker:
        _worker(a.model, spec, layouts)
        return 0
    rows = check_layouts(a.model, spec, layouts)
    print(f"{a.model}, training batch {a.batch} x seq {a.seq}, {a.dtype}, {a.optimizer}")
    print(format_table(rows))
    worst = max(abs(r.error) for r in rows)
    print(f"largest error {worst:.3%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
