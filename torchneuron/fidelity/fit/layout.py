"""Per-core memory under a parallel layout, and the smallest layout that fits a target.

The step is traced once, on one replica's micro-batch with the whole model; a layout then
divides what it shards. Sharding rules (stated, not traced): tensor parallelism (tp) splits
parameters, gradients, optimizer state, the KV cache's heads and every activation whose last
dimension is not the hidden size (attention heads, MLP intermediates, logits), while the
residual stream stays replicated (no sequence parallelism); FSDP splits parameters,
gradients and optimizer state and adds gather/scatter buffers; data parallelism (dp)
replicates and adds DDP's gradient buckets.
"""

from __future__ import annotations

from dataclasses import dataclass

from .chips import Target
from .trace import CATEGORIES, StepTrace
from .tracker import StorageRecord

_DDP_BUCKET_BYTES = 25 << 20  # DistributedDataParallel's default bucket_cap_mb


@dataclass(frozen=True)
class Layout:
    """Ranks per dimension. pp (pipeline stages) is traced only (``sharded.py``): the
    rescaling rules here refuse it."""

    tp: int = 1
    fsdp: int = 1
    dp: int = 1
    pp: int = 1

    def __post_init__(self) -> None:
        for name in ("tp", "fsdp", "dp", "pp"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def cores(self) -> int:
        return self.tp * self.fsdp * self.dp * self.pp

    def __str__(self) -> str:
        pp = f" pp={self.pp}" if self.pp > 1 else ""
        return f"tp={self.tp} fsdp={self.fsdp} dp={self.dp}{pp} ({self.cores} cores)"


@dataclass(frozen=True)
class ModelShape:
    """What the sharding rules need to know about the model."""

    hidden_size: int
    num_kv_heads: int
    num_heads: int
    largest_layer_param_bytes: int  # one decoder layer's parameters, unsharded


@dataclass
class CoreFit:
    layout: Layout
    target: Target
    breakdown: dict[str, int]

    @property
    def peak_bytes(self) -> int:
        return sum(self.breakdown.values())

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.target.hbm_bytes


def _core_bytes(kind: str, record: StorageRecord, layout: Layout, shape: ModelShape) -> int:
    """What one core of ``layout`` holds of a storage the single-device trace saw."""
    shard = layout.tp * layout.fsdp
    if kind in ("parameters", "gradients", "optimizer_state") or record.phase == "optimizer":
        return -(-record.nbytes // shard)  # the optimizer works on each core's shards
    if kind == "kv_cache":
        return -(-record.nbytes // min(layout.tp, max(shape.num_kv_heads, 1)))
    if record.shape[-1:] == (shape.hidden_size,) or len(record.shape) <= 1:
        return record.nbytes  # the residual stream is replicated across tp
    return -(-record.nbytes // layout.tp)


def per_core_breakdown(trace: StepTrace, layout: Layout, shape: ModelShape) -> dict[str, int]:
    """The categories one core of ``layout`` holds at its own peak of the traced step.

    The peak is found again on the sharded sizes: sharding the states moves it (often from
    the optimizer step to the end of the forward, where activations are highest).
    """
    if layout.pp > 1:
        raise ValueError(f"{layout}: pipeline layouts are traced, not rescaled (--traced)")
    deltas: dict[int, list[tuple[str, int]]] = {}
    for kind, record in trace.records:
        size = _core_bytes(kind, record, layout, shape)
        deltas.setdefault(record.born, []).append((kind, size))
        if record.died is not None:
            deltas.setdefault(record.died, []).append((kind, -size))
    live = dict.fromkeys(CATEGORIES, 0)
    best = dict(live)
    best_total = -1
    for index in sorted(deltas):
        for kind, size in deltas[index]:
            live[kind] += size
        total = sum(live.values())
        if total > best_total:
            best_total, best = total, dict(live)
    best["collective_buffers"] += collective_buffer_bytes(trace, layout, shape)
    return best


def collective_buffer_bytes(trace: StepTrace, layout: Layout, shape: ModelShape) -> int:
    """Buffers the collectives of ``layout`` hold at the peak (an analytical estimate)."""
    spec = trace.spec
    total = 0
    layer = shape.largest_layer_param_bytes // layout.tp
    if layout.fsdp > 1:
        # FSDP2 gathers one layer's parameters and prefetches the next; in training the
        # backward also holds one layer's unsharded gradients for the reduce-scatter.
        total += 2 * layer + (layer if spec.training else 0)
    if layout.tp > 1:
        # The row-parallel output's all-reduce: one residual-stream activation, in and out.
        element = 2 if spec.autocast or spec.dtype != "fp32" else 4
        total += (
            2 * spec.batch * (1 if not spec.training else spec.seq) * shape.hidden_size * element
        )
    if layout.dp > 1 and spec.training:
        total += 2 * _DDP_BUCKET_BYTES
    return total


def fit(trace: StepTrace, layout: Layout, target: Target, shape: ModelShape) -> CoreFit:
    return CoreFit(layout, target, per_core_breakdown(trace, layout, shape))


def candidate_layouts(shape: ModelShape, max_cores: int) -> list[Layout]:
    """tp × fsdp layouts on powers of two up to ``max_cores``, fewest cores first, then less tp."""
    layouts = []
    cores = 1
    while cores <= max_cores:
        tp = 1
        while tp <= cores:
            if shape.num_heads % tp == 0:
                layouts.append(Layout(tp=tp, fsdp=cores // tp))
            tp *= 2
        cores *= 2
    return sorted(layouts, key=lambda lay: (lay.cores, lay.tp))


def smallest_fitting_layout(
    trace: StepTrace, target: Target, shape: ModelShape, max_cores: int = 512
) -> CoreFit | None:
    for layout in candidate_layouts(shape, max_cores):
        candidate = fit(trace, layout, target, shape)
        if candidate.fits:
            return candidate
    return None
