"""The audit itself: graphs compiled during a block of code, from the neuron backend's record."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .buckets_advice import BucketAdvice, advise_buckets


@dataclass
class Graph:
    compile_id: str
    code: str
    signature: list[tuple[str, tuple[int, ...], str]]
    reason: str


@dataclass
class AuditResult:
    """Filled when the ``audit()`` block ends."""

    graphs: list[Graph] = field(default_factory=list)
    host_graphs: int = 0  # forward/backward/inference graphs: what Trainium would compile
    dynamo_recompile_reasons: dict[str, int] = field(default_factory=dict)
    advice: list[BucketAdvice] = field(default_factory=list)

    @property
    def compiles(self) -> int:
        return len(self.graphs)

    def as_dict(self) -> dict[str, Any]:
        return {
            "graphs": [g.__dict__ for g in self.graphs],
            "compiles": self.compiles,
            "neuron_compiles": self.host_graphs,
            "dynamo_recompile_reasons": self.dynamo_recompile_reasons,
            "bucketing": [
                {
                    "code": a.code,
                    "graphs_now": a.graphs_now,
                    "graphs_with_buckets": a.graphs_with_buckets,
                    "buckets": {f"{n} dim {d}": b for (n, d), b in a.buckets.items()},
                }
                for a in self.advice
            ],
        }

    def format(self) -> str:
        lines = [
            f"compile audit: {self.compiles} graph(s) captured, {self.host_graphs} neuron "
            "compile(s) (forward, backward and inference graphs; each one is a NEFF on Trainium)"
        ]
        for i, g in enumerate(self.graphs):
            inputs = ", ".join(
                f"{n}{list(s)} {d.replace('torch.', '')}"
                for n, s, d in g.signature
                if "._parameters[" not in n and "._buffers[" not in n  # weights: not news
            )
            lines.append(f"  [{i}] {g.compile_id} {g.code}: {inputs}")
            lines.append(f"       why: {g.reason}")
        for reason, count in self.dynamo_recompile_reasons.items():
            lines.append(f"  dynamo recompile ({count}x): {reason}")
        if self.advice:
            lines.append("bucketing that would cut it:")
            lines.extend(f"  {a.describe()}" for a in self.advice)
        else:
            lines.append("no shape-driven recompiles: nothing to bucket")
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=1)


def _advise(graphs: list[Graph], multiple: int) -> list[BucketAdvice]:
    frames: dict[tuple[str, tuple[str, ...]], list[list[tuple[str, tuple[int, ...], str]]]] = {}
    for g in graphs:
        names = tuple(n for n, _, _ in g.signature)
        frames.setdefault((g.code, names), []).append(g.signature)
    advice = [advise_buckets(code, sigs, multiple) for (code, _), sigs in frames.items()]
    return [a for a in advice if a.varying and a.graphs_with_buckets < a.graphs_now]


@contextlib.contextmanager
def audit(multiple: int = 128) -> Iterator[AuditResult]:
    """Records the neuron graphs compiled inside the block (Dynamo's counters included)."""
    from torch._dynamo.utils import counters

    from ...compile.backend import metrics

    with metrics.lock:
        first = len(metrics.graphs)
        hosts = metrics.host_graphs
    before = dict(counters["recompiles"])
    result = AuditResult()
    try:
        yield result
    finally:
        with metrics.lock:
            entries = list(metrics.graphs[first:])
            result.host_graphs = metrics.host_graphs - hosts
        result.graphs = [
            Graph(e["compile_id"], e["code"], list(e["signature"]), e["reason"]) for e in entries
        ]
        after = dict(counters["recompiles"])
        result.dynamo_recompile_reasons = {
            k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) > 0
        }
        result.advice = _advise(result.graphs, multiple)
