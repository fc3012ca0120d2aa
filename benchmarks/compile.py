"""torch.compile on neuron: against Inductor on the CPU, against eager, and its compile times.

One Llama-style model built from a config (no download) with the same weights everywhere:

* inference (forward under no_grad) and a training step (forward, backward, AdamW step; the
  model is compiled, the optimizer runs eagerly), each timed as
  - CPU, compiled by Inductor (``torch.compile(model)``, the baseline),
  - neuron, compiled with ``backend="neuron"``,
  - neuron, eager;
  ratio = baseline time / neuron compiled time (target >= 0.95, issue 5), and
  neuron eager time / neuron compiled time (what compiling buys on the device);
* cold and warm start: a fresh interpreter compiles the model (forward and backward) with an
  empty cache directory (TORCH_NEURONX_NEFF_CACHE_DIR), then another fresh interpreter does
  the same with the filled directory; each reports the seconds from the compile call to the
  first finished backward.

Both devices run one intra-op thread (--threads), alternate in blocks and report medians
(_harness.py).

    python benchmarks/compile.py              # full run (several minutes: C++ compiles)
    python benchmarks/compile.py --quick      # fewer rounds, no warm/cold start
    python benchmarks/compile.py --markdown   # also print the table as Markdown
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from _harness import (
    Table,
    calibrate,
    fmt,
    gc_paused,
    interleaved,
    parse_and_start,
    print_table,
)

TARGET = 0.95  # Inductor-on-CPU time / neuron compiled time, at least
BATCH, SEQ = 4, 128


def llama_config():  # noqa: ANN201 - transformers type, imported lazily
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=512,
    )


def build(device: str) -> torch.nn.Module:
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(llama_config())
    model.config.use_cache = False
    return model.to(device)


@dataclass
class Row:
    workload: str
    baseline: str
    base_s: float
    neuron_s: float
    target: float | None

    @property
    def ratio(self) -> float:
        return self.base_s / self.neuron_s


def inference_call(model: Callable[..., object], ids: torch.Tensor) -> Callable[[], object]:
    def run() -> object:
        with torch.no_grad():
            return model(ids).logits

    return run


def training_call(
    model: Callable[..., torch.Tensor], params: torch.nn.Module, ids: torch.Tensor
) -> Callable[[], None]:
    optimizer = torch.optim.AdamW(params.parameters(), lr=1e-4)

    def run() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(ids, labels=ids).loss.backward()
        optimizer.step()

    return run


def measure(quick: bool) -> list[Row]:
    ids_cpu = torch.randint(0, 4096, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    ids = {"cpu": ids_cpu, "neuron": ids_cpu.to("neuron")}
    rows: list[Row] = []
    for workload in ("inference", "training step"):
        models = {"cpu": build("cpu"), "neuron": build("neuron")}
        eager = copy.deepcopy(models["neuron"])
        compiled = {
            "cpu": torch.compile(models["cpu"]),
            "neuron compiled": torch.compile(models["neuron"], backend="neuron"),
        }
        if workload == "inference":
            fns = {
                "cpu": inference_call(compiled["cpu"], ids["cpu"]),
                "neuron compiled": inference_call(compiled["neuron compiled"], ids["neuron"]),
                "neuron eager": inference_call(eager, ids["neuron"]),
            }
        else:
            fns = {
                "cpu": training_call(compiled["cpu"], models["cpu"], ids["cpu"]),
                "neuron compiled": training_call(
                    compiled["neuron compiled"], models["neuron"], ids["neuron"]
                ),
                "neuron eager": training_call(eager, eager, ids["neuron"]),
            }
        print(f"compiling {workload} (Inductor CPU, neuron) ...", flush=True)
        for fn in fns.values():  # compile outside the timed blocks
            fn()
        # At least two calls per block and nine rounds: a training step is ~0.2 s, and
        # single-call blocks let one scheduler hiccup move the median by 5%.
        iterations = max(1 if quick else 2, calibrate(fns["cpu"], "cpu", 0.05 if quick else 0.4))
        rounds = 3 if quick else 9
        print(f"timing {workload}: {rounds} rounds of {iterations} calls ...", flush=True)
        t = interleaved(fns, iterations, rounds)
        rows.append(Row(workload, "Inductor CPU", t["cpu"], t["neuron compiled"], TARGET))
        rows.append(Row(workload, "neuron eager", t["neuron eager"], t["neuron compiled"], None))
        del fns, compiled, models, eager
        torch._dynamo.reset()
        torch.neuron.empty_cache()
    return rows


CHILD = """
import sys, time, json
sys.path.insert(0, {bench_dir!r})
import torch, torchneuron
torch.set_num_threads({threads})
from compile import build, BATCH, SEQ
model = build("neuron")
ids = torch.randint(0, 4096, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
ids = ids.to("neuron")
start = time.perf_counter()
loss = torch.compile(model, backend="neuron")(ids, labels=ids).loss
loss.backward()
torch.neuron.synchronize()
seconds = time.perf_counter() - start
metrics = torch.neuron.get_dynamo_metrics()
print(json.dumps({{"seconds": seconds, "hits": metrics["cache_hits"],
                  "misses": metrics["cache_misses"]}}))
"""


def start_time(cache: str, threads: int) -> dict[str, float]:
    env = dict(os.environ, TORCH_NEURONX_NEFF_CACHE_DIR=cache)
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    code = CHILD.format(bench_dir=os.path.dirname(os.path.abspath(__file__)), threads=threads)
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=3600
    )
    if out.returncode != 0:
        raise RuntimeError(f"start-time child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(rows: list[Row]) -> Table:
    header = ["workload", "baseline", "baseline ms", "neuron compiled ms", "ratio", "target"]
    body = [
        [
            r.workload,
            r.baseline,
            fmt(r.base_s * 1e3),
            fmt(r.neuron_s * 1e3),
            f"{r.ratio:.3f}",
            (f">= {r.target} " + ("pass" if r.ratio >= r.target else "MISS")) if r.target else "-",
        ]
        for r in rows
    ]
    return Table(header, body)


def main(argv: list[str] | None = None) -> int:
    args = parse_and_start(__doc__.split("\n")[0], "fewer rounds, no start times", argv)
    if args is None:
        return 2
    params = sum(p.numel() for p in build("cpu").parameters())
    print(
        f"Llama from config: {params / 1e6:.1f}M parameters, batch {BATCH} x {SEQ} tokens",
        flush=True,
    )
    start = time.perf_counter()
    with gc_paused():
        rows = measure(args.quick)
    starts: list[tuple[str, dict[str, float]]] = []
    if not args.quick:
        with tempfile.TemporaryDirectory(prefix="neff-bench-") as cache:
            for label in ("cold (empty cache)", "warm (cache filled)"):
                print(f"start time, {label} ...", flush=True)
                starts.append((label, start_time(cache, max(args.threads, 1))))
    print_table(table(rows), args.markdown)
    for label, result in starts:
        print(
            f"compile to first backward, {label}: {result['seconds']:.1f} s "
            f"(cache hits {result['hits']}, misses {result['misses']})"
        )
    if len(starts) == 2:
        print(f"warm start / cold start: {starts[1][1]['seconds'] / starts[0][1]['seconds']:.3f}")
    print(
        f"measured in {time.perf_counter() - start:.0f} s; "
        f"load average {os.getloadavg()[0]:.2f} at end"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
