"""Traces one step with fake tensors and breaks the peak of live bytes down by category."""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import Any

import torch

from .step import StepResult, StepSpec, run_step, unwrapped
from .tracker import LiveBytesTrace, LiveBytesTracker, StorageRecord, plain_tensors

CATEGORIES = (
    "parameters",
    "gradients",
    "optimizer_state",
    "activations",
    "temporaries",
    "kv_cache",
    "collective_buffers",
)


@dataclass
class StepTrace:
    """The peak of one step on one device, and the storages alive at that moment."""

    spec: StepSpec
    peak_bytes: int
    breakdown: dict[str, int]
    records: list[tuple[str, StorageRecord]]  # (category, storage), every storage of the step
    timeline: list[tuple[int, int]] = field(default_factory=list)
    phase_marks: list[tuple[str, int]] = field(default_factory=list)  # phase, first event
    hidden_size: int = 0
    num_heads: int = 1
    num_kv_heads: int = 1
    largest_layer_param_bytes: int = 0


def _classify(
    trace: LiveBytesTrace, tracker: LiveBytesTracker, params: set[int], result: StepResult
) -> dict[int, str]:
    kinds: dict[int, str] = {s: "parameters" for s in params}
    for name, tensors in (
        ("gradients", result.gradients),
        ("optimizer_state", result.optimizer_state),
        ("kv_cache", result.kv_cache),
    ):
        for t in tensors:
            serial = tracker.serial_of(t)
            if serial is not None:
                kinds.setdefault(serial, name)
    for r in trace.records:
        if r.serial not in kinds:
            if r.collective:  # gathered parameters, gradient buckets, reduce-scatter buffers
                kinds[r.serial] = "collective_buffers"
            elif r.phase in ("inputs", "forward"):
                kinds[r.serial] = "activations"
            else:
                kinds[r.serial] = "temporaries"
    return kinds


def trace_model_step(
    build: Any, spec: StepSpec, fake: bool = True, device: str = "neuron", step: Any = run_step
) -> StepTrace:
    """Builds the model with ``build()`` and traces ``spec``'s step on it.

    ``fake=True`` runs under FakeTensorMode: no memory is allocated, any size can be traced.
    ``step(model, spec, device=..., tracker=...)`` runs the step (``run_step``, or a
    pipeline stage's schedule).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode: Any = FakeTensorMode() if fake else None
    if mode is not None:
        mode.__enter__()
    try:
        tracker = LiveBytesTracker(device.split(":")[0])
        marks: list[tuple[str, int]] = []
        with tracker:
            # The build is followed too: what it leaves on the device (DistributedDataParallel's
            # gradient buckets, say) is there when the step starts, as in a real run, whose
            # peak is measured from there. What it frees, such as the unsharded weights or the
            # other pipeline stages' layers (cyclic garbage: hence the collection), is not.
            model = build()
            gc.collect()
            params = {
                s
                for t in list(model.parameters()) + list(model.buffers())
                for local in plain_tensors(t)  # a DTensor's memory is its local shard
                if (s := tracker.register(local, "parameters")) is not None
            }
            start = tracker.trace.events
            phase_hook = _PhaseMarks(tracker, marks)
            result = step(model, spec, device=device, tracker=phase_hook)
        trace = tracker.trace.since(start)
        kinds = _classify(trace, tracker, params, result)
        peak, at = trace.peak()
        breakdown = dict.fromkeys(CATEGORIES, 0)
        for r in trace.live_at(at):
            breakdown[kinds[r.serial]] += r.nbytes
        every = [(kinds[r.serial], r) for r in trace.records]
        config = unwrapped(model).config
        heads = int(getattr(config, "num_attention_heads", 1))
        step_trace = StepTrace(
            spec,
            peak,
            breakdown,
            every,
            trace.timeline(),
            marks,
            hidden_size=int(getattr(config, "hidden_size", 0)),
            num_heads=heads,
            num_kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            largest_layer_param_bytes=_largest_layer_bytes(model),
        )
        del result, model
        gc.collect()
        return step_trace
    finally:
        if mode is not None:
            mode.__exit__(None, None, None)


def _largest_layer_bytes(model: torch.nn.Module) -> int:
    """Parameter bytes of the largest block of the model's longest ModuleList (its layers)."""
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    if not lists:
        return sum(p.nbytes for p in model.parameters())
    layers = max(lists, key=len)
    return max(sum(p.nbytes for p in layer.parameters()) for layer in layers)


class _PhaseMarks:
    """Forwards phase changes to the tracker and notes at which event each phase began."""

    def __init__(self, tracker: LiveBytesTracker, marks: list[tuple[str, int]]) -> None:
        self._tracker = tracker
        self._marks = marks

    @property
    def phase(self) -> str:
        return self._tracker.phase

    @phase.setter
    def phase(self, value: str) -> None:
        self._tracker.phase = value
        self._marks.append((value, self._tracker.trace.events))


def predict_single_device(config: Any, spec: StepSpec) -> StepTrace:
    """The peak bytes of ``spec``'s step of a Transformers causal LM on one logical core."""
    from .model_source import build_model

    return trace_model_step(lambda: build_model(config, spec.torch_dtype), spec, fake=True)


def measure_single_device(config: Any, spec: StepSpec, device: str = "neuron") -> int:
    """Runs the step for real and returns ``torch.neuron.max_memory_allocated`` over it.

    The model is built on the CPU and moved, so its initialisation leaves nothing behind.
    """
    from .model_source import build_model

    torch.manual_seed(0)
    model = build_model(config, spec.torch_dtype, device="cpu").to(device)
    torch.neuron.synchronize()
    torch.neuron.reset_peak_memory_stats()
    result = run_step(model, spec, device=device)
    torch.neuron.synchronize()
    peak = int(torch.neuron.max_memory_allocated())
    del result, model
    gc.collect()
    torch.neuron.empty_cache()
    return peak
