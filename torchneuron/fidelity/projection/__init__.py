"""Projected step time, tokens/s and MFU of a step on Trainium, from a fake-tensor trace.

Each op of the traced step costs its FLOPs (PyTorch's flop formulas) and the bytes it reads
and writes; on a target it takes the longer of FLOPs / Tensor-engine peak (BF16 or FP32 by
its dtype) and bytes / HBM bandwidth, as if nothing were fused. A layout divides the work by
tp and adds ring collectives over NeuronLink without overlap. Both choices are pessimistic
(see docs/fidelity.md for how far this lands from AWS's published throughputs).
"""

from __future__ import annotations

from typing import Any

from ..fit.chips import Target, find_target, targets
from ..fit.layout import Layout
from ..fit.model_source import build_model, load_config
from ..fit.step import StepSpec, run_step
from .op_costs import OpCostMode, StepCosts
from .roofline import Projection, project


def trace_costs(config: Any, spec: StepSpec) -> tuple[StepCosts, int]:
    """(per-op costs of one replica's step, parameter bytes), traced with fake tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        model = build_model(config, spec.torch_dtype)
        param_bytes = sum(p.nbytes for p in model.parameters())
        with OpCostMode() as mode:
            run_step(model, spec)
    return mode.costs, param_bytes


def project_step(
    model: str,
    spec: StepSpec | None = None,
    layout: Layout | None = None,
    chips: list[str] | None = None,
) -> list[Projection]:
    spec = spec or StepSpec()
    layout = layout or Layout()
    config = load_config(model)
    costs, param_bytes = trace_costs(config, spec)
    element = 2 if spec.autocast or spec.dtype != "fp32" else 4
    rows = spec.batch * (spec.seq if spec.training else 1)
    activation = rows * int(config.hidden_size) * element
    layers = int(getattr(config, "num_hidden_layers", 1))
    chosen: list[Target] = [find_target(c) for c in chips] if chips else targets()
    return [
        project(costs, t, layout, spec.tokens, param_bytes, activation, layers, spec.training)
        for t in chosen
    ]


__all__ = ["Projection", "StepCosts", "project_step", "trace_costs"]
