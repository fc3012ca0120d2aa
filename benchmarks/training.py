"""Tokens/s of the SFT training step of a small Llama: neuron vs CPU, eager and compiled.

The step is what ``SFTTrainer`` runs per batch: forward with labels (causal-LM loss),
backward, ``torch.optim.AdamW`` step (fused on both devices, Trainer's default
``adamw_torch_fused``), zero_grad. The model (20.0M parameters, 4 layers, hidden 512, vocab 8000)
is built from a config with a fixed seed; the neuron copy carries the CPU copy's weights.
Pairs, each measured in the same run with alternating blocks (medians):

  - neuron eager vs CPU eager;
  - neuron compiled (``torch.compile(model, backend="neuron")``) vs Inductor on the CPU
    (``torch.compile(model)``); the optimizer runs eagerly on both;

each in float32 and under bf16 autocast (``torch.autocast(device_type, torch.bfloat16)``,
what ``bf16=True`` does in Trainer). ratio = neuron tok/s / CPU tok/s, target >= 1.0
(issue 12). Peak device memory is ``torch.neuron.max_memory_allocated()`` over the pair's
steps. The first step's loss is compared between the devices as a sanity check.

    python benchmarks/training.py              # all four pairs
    python benchmarks/training.py --quick      # fewer rounds
    python benchmarks/training.py --no-compile # eager pairs only
    python benchmarks/training.py --markdown   # also print the table as Markdown
"""

from __future__ import annotations

import contextlib
import copy
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from _harness import Table, fmt, gc_paused, geomean, interleaved, parse_and_start, print_table

TARGET = 1.0
BATCH = 4
SEQ = 128


def llama_config():  # noqa: ANN201 - transformers type, imported lazily
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=8000,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=SEQ,
        tie_word_embeddings=False,
    )


@dataclass
class Row:
    mode: str  # "eager" or "compiled"
    dtype: str
    cpu: float  # tokens per second
    neuron: float
    peak_mib: float
    loss_diff: float
    doubt: str | None = None  # why the pair is not a measurement (harness.Medians.doubt)

    @property
    def ratio(self) -> float:
        return self.neuron / self.cpu

    @property
    def ratio_text(self) -> str:
        return "unstable" if self.doubt else f"{self.ratio:.3f}"


def make_step(
    model: torch.nn.Module,
    forward: Callable[..., object],
    ids: torch.Tensor,
    bf16: bool,
) -> tuple[Callable[[], object], list[float]]:
    """One SFT step as a closure; the list collects the losses it computes (first step only)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    device_type = ids.device.type
    losses: list[float] = []

    def step() -> object:
        autocast = (
            torch.autocast(device_type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        )
        with autocast:
            loss = forward(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if not losses:
            losses.append(float(loss.detach().float().cpu()))
        return loss

    return step, losses


def measure(base: torch.nn.Module, compiled: bool, bf16: bool, rounds: int) -> Row:
    ids_cpu = torch.randint(
        1, base.config.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(0)
    )
    cpu_model = copy.deepcopy(base).train()
    torch.neuron.empty_cache()
    torch.neuron.reset_peak_memory_stats()
    neuron_model = copy.deepcopy(base).to("neuron").train()
    if compiled:
        forwards = {
            "cpu": torch.compile(cpu_model),
            "neuron": torch.compile(neuron_model, backend="neuron"),
        }
    else:
        forwards = {"cpu": cpu_model, "neuron": neuron_model}
    cpu_step, cpu_losses = make_step(cpu_model, forwards["cpu"], ids_cpu, bf16)
    neuron_step, neuron_losses = make_step(
        neuron_model, forwards["neuron"], ids_cpu.to("neuron"), bf16
    )
    cpu_step()  # the first step compiles, outside the timed blocks
    neuron_step()
    with gc_paused():
        seconds = interleaved({"cpu": cpu_step, "neuron": neuron_step}, 1, rounds, warmup=1)
    tokens = BATCH * SEQ
    row = Row(
        "compiled" if compiled else "eager",
        "bf16 autocast" if bf16 else "float32",
        tokens / seconds["cpu"],
        tokens / seconds["neuron"],
        torch.neuron.max_memory_allocated() / 2**20,
        abs(cpu_losses[0] - neuron_losses[0]),
        seconds.doubt("cpu") or seconds.doubt("neuron"),
    )
    print(
        f"  {row.mode:<8} {row.dtype:<13}: cpu {fmt(row.cpu)} tok/s, neuron {fmt(row.neuron)} "
        f"tok/s, ratio {row.ratio_text}, peak {row.peak_mib:.0f} MiB, "
        f"|first loss cpu - neuron| {row.loss_diff:.2g}",
        flush=True,
    )
    return row


def table(rows: list[Row]) -> Table:
    header = ["mode", "dtype", "cpu tok/s", "neuron tok/s", "ratio", "peak MiB", "pass/miss"]
    body = [
        [
            r.mode,
            r.dtype,
            fmt(r.cpu),
            fmt(r.neuron),
            r.ratio_text,
            f"{r.peak_mib:.0f}",
            "unstable" if r.doubt else "pass" if r.ratio >= TARGET else "MISS",
        ]
        for r in rows
    ]
    return Table(header, body)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    eager_only = "--no-compile" in argv
    argv = [a for a in argv if a != "--no-compile"]
    args = parse_and_start(__doc__.split("\n")[0], "3 rounds instead of 5", argv)
    if args is None:
        return 2
    from transformers import LlamaForCausalLM

    cpu_name = "unknown CPU"
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            cpu_name = next(
                (ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                cpu_name,
            )
    print(f"CPU model: {cpu_name}; ISA used by ATen: {torch.backends.cpu.get_cpu_capability()}")
    torch.manual_seed(0)
    base = LlamaForCausalLM(llama_config())
    params = sum(p.numel() for p in base.parameters())
    print(f"model: Llama {params / 1e6:.1f}M parameters, batch {BATCH} x {SEQ} tokens per step")
    rounds = 3 if args.quick else 5
    rows = []
    for compiled in (False,) if eager_only else (False, True):
        for bf16 in (False, True):
            rows.append(measure(base, compiled, bf16, rounds))
    print_table(table(rows), args.markdown)
    measured = [r.ratio for r in rows if not r.doubt]
    if measured:
        print(f"geomean ratio: {geomean(measured):.3f} over {len(measured)} of {len(rows)} pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
