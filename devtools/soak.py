"""Soak: long training and generation loops on `neuron`, watching for leaks.

``python -m devtools.soak`` runs three loops of 10,000 steps each (eager training,
training compiled with ``backend="neuron"``, and static-cache generation the way
Transformers does it by default on neuron: compiled decode steps), sampling after every
``--every`` steps the device memory (allocated, reserved), the host's resident set, the open
file descriptors and the shared-memory segments of this process. After warm-up (the first
``--warmup`` fraction of the steps) every curve must be flat: device memory exactly, the
descriptor and segment counts exactly, the resident set within ``--rss-slack`` MiB.
``--steps`` shortens it (the test suite runs a few hundred steps); ``--markdown`` prints the
tables for docs/reliability.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence

import torch

MiB = 1 << 20


@dataclasses.dataclass
class Sample:
    step: int
    allocated: int
    reserved: int
    rss: int
    fds: int
    shm_maps: int


@dataclasses.dataclass
class SoakResult:
    name: str
    steps: int
    seconds: float
    samples: list[Sample]
    warmup_steps: int

    def steady(self) -> list[Sample]:
        return [s for s in self.samples if s.step >= self.warmup_steps]

    def growth(self) -> dict[str, int]:
        """Largest minus smallest value of each curve after warm-up."""
        steady = self.steady()
        fields = ("allocated", "reserved", "rss", "fds", "shm_maps")
        return {
            f: max(getattr(s, f) for s in steady) - min(getattr(s, f) for s in steady)
            for f in fields
        }

    def problems(self, rss_slack: int) -> list[str]:
        grown = self.growth()
        found = [
            f"{self.name}: {k} varies by {v} after warm-up"
            for k, v in grown.items()
            if k != "rss" and v != 0
        ]
        if grown["rss"] > rss_slack:
            found.append(
                f"{self.name}: resident set grows by {grown['rss'] / MiB:.1f} MiB "
                f"after warm-up (slack {rss_slack / MiB:.0f} MiB)"
            )
        return found


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _shared_memory_maps() -> int:
    """Mappings of /dev/shm files (shared-memory segments) in this process."""
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if "/dev/shm/" in line)


def take_sample(step: int, device: torch.device) -> Sample:
    torch.neuron.synchronize(device)
    return Sample(
        step=step,
        allocated=torch.neuron.memory_allocated(device),
        reserved=torch.neuron.memory_reserved(device),
        rss=_rss_bytes(),
        fds=len(os.listdir("/proc/self/fd")),
        shm_maps=_shared_memory_maps(),
    )


def _tiny_transformer(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(
        64, 4, dim_feedforward=128, batch_first=True, dropout=0.1
    )
    return torch.nn.Sequential(layer, torch.nn.Linear(64, 64)).to(device)


def training_steps(device: torch.device, compiled: bool) -> Iterator[None]:
    """One optimizer step per iteration, with dropout, on fixed shapes."""
    model = _tiny_transformer(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    forward = torch.compile(model, backend="neuron") if compiled else model
    generator = torch.Generator(device=device).manual_seed(1)
    while True:
        x = torch.randn(4, 16, 64, device=device, generator=generator)
        loss = forward(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        yield


def generation_steps(device: torch.device) -> Iterator[None]:
    """One decode step per iteration: generate() calls of 32 new tokens with a static cache,
    compiled by Transformers as it does by default on a neuron device."""
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(device).eval()
    prompt = torch.randint(0, 256, (1, 8), device=device)
    new_tokens = 32
    first = None
    compiles_before = torch.neuron.get_dynamo_metrics()["compiles"]
    while True:
        out = model.generate(
            prompt,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            cache_implementation="static",
            pad_token_id=0,
        )
        if first is None:
            first = out.cpu()
            if torch.neuron.get_dynamo_metrics()["compiles"] == compiles_before:
                raise AssertionError("generate() did not compile its decode step on neuron")
        elif not torch.equal(out.cpu(), first):
            raise AssertionError("greedy generation changed between identical calls")
        for _ in range(new_tokens):
            yield


LOOPS: dict[str, Callable[[torch.device], Iterator[None]]] = {
    "train-eager": lambda d: training_steps(d, compiled=False),
    "train-compiled": lambda d: training_steps(d, compiled=True),
    "generate-compiled": generation_steps,
}


def soak(
    name: str,
    steps: int,
    every: int,
    warmup: float,
    device: torch.device | None = None,
    progress: Callable[[str], None] | None = None,
) -> SoakResult:
    """Runs loop `name` for `steps` steps, sampling every `every` steps."""
    device = device or torch.device("neuron", 0)
    loop = LOOPS[name](device)
    samples: list[Sample] = []
    start = time.monotonic()
    for step in range(1, steps + 1):
        next(loop)
        if step % every == 0 or step == steps:
            samples.append(take_sample(step, device))
            if progress is not None:
                s = samples[-1]
                progress(
                    f"{name} {step}/{steps}: allocated {s.allocated / MiB:.2f} MiB, "
                    f"reserved {s.reserved / MiB:.1f} MiB, RSS {s.rss / MiB:.0f} MiB, "
                    f"fds {s.fds}, shm maps {s.shm_maps}"
                )
    loop.close()
    return SoakResult(name, steps, time.monotonic() - start, samples, int(steps * warmup))


def markdown(results: Sequence[SoakResult]) -> str:
    lines = [
        "| loop | steps | s | allocated (MiB) | reserved (MiB) | RSS first→last (MiB) "
        "| growth after warm-up: allocated / reserved / RSS / fds / shm |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for r in results:
        steady, g = r.steady(), r.growth()
        lines.append(
            f"| {r.name} | {r.steps} | {r.seconds:.0f} | {steady[-1].allocated / MiB:.2f} "
            f"| {steady[-1].reserved / MiB:.1f} | {steady[0].rss / MiB:.0f}→"
            f"{steady[-1].rss / MiB:.0f} | {g['allocated']} B / {g['reserved']} B / "
            f"{g['rss'] / MiB:.2f} MiB / {g['fds']} / {g['shm_maps']} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--every", type=int, default=500, help="sample every N steps")
    parser.add_argument("--warmup", type=float, default=0.1, help="fraction of steps")
    parser.add_argument("--rss-slack", type=float, default=16.0, help="MiB")
    parser.add_argument("--loops", nargs="*", choices=sorted(LOOPS), default=list(LOOPS))
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    results = [soak(n, args.steps, args.every, args.warmup, progress=say) for n in args.loops]
    problems = [p for r in results for p in r.problems(int(args.rss_slack * MiB))]
    if args.markdown:
        print(markdown(results))
    for p in problems:
        print(f"LEAK: {p}")
    print("soak: " + ("FAILED" if problems else "flat after warm-up"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
