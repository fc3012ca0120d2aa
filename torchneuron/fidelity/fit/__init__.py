"""Will it fit? Peak HBM per logical core of a training or inference step on Trainium.

One step is traced with fake tensors (nothing is allocated), the live bytes followed over
time as the caching allocator would count them, and the peak broken down by category; a
layout (tp, fsdp, dp) then divides what it shards. ``python -m torchneuron.fidelity.fit --help``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .chips import Target, find_target, targets
from .layout import CoreFit, Layout, ModelShape, fit, smallest_fitting_layout
from .model_source import PRESETS, load_config
from .step import StepSpec
from .trace import CATEGORIES, StepTrace, measure_single_device, predict_single_device


@dataclass
class FitReport:
    """The step's trace, its fit on each target under the chosen layout, the smallest fit."""

    model: str
    trace: StepTrace
    layout: Layout
    fits: list[CoreFit]
    smallest: dict[str, CoreFit | None] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "spec": self.trace.spec.__dict__,
            "layout": self.layout.__dict__,
            "single_device_peak_bytes": self.trace.peak_bytes,
            "targets": [
                {
                    "target": f.target.name,
                    "capacity_bytes": f.target.hbm_bytes,
                    "peak_bytes": f.peak_bytes,
                    "fits": f.fits,
                    "breakdown": f.breakdown,
                    "smallest_layout": (
                        None
                        if (s := self.smallest.get(f.target.name)) is None
                        else {**s.layout.__dict__, "peak_bytes": s.peak_bytes}
                    ),
                }
                for f in self.fits
            ],
        }


def model_shape(trace: StepTrace) -> ModelShape:
    return ModelShape(
        trace.hidden_size, trace.num_kv_heads, trace.num_heads, trace.largest_layer_param_bytes
    )


def estimate(
    model: str,
    spec: StepSpec | None = None,
    layout: Layout | None = None,
    chips: list[str] | None = None,
    max_cores: int = 512,
) -> FitReport:
    """Fit of ``model`` (preset, config.json or checkpoint dir) for ``spec`` under ``layout``.

    ``spec.batch`` is one data-parallel replica's micro-batch. ``chips`` selects targets
    ('trn2', 'trn2:1'); default: every chip at every logical-core grouping.
    """
    spec = spec or StepSpec()
    layout = layout or Layout()
    config = load_config(model)
    trace = predict_single_device(config, spec)
    shape = model_shape(trace)
    chosen: list[Target] = [find_target(c) for c in chips] if chips else targets()
    fits = [fit(trace, layout, t, shape) for t in chosen]
    smallest = {t.name: smallest_fitting_layout(trace, t, shape, max_cores) for t in chosen}
    return FitReport(model, trace, layout, fits, smallest)


__all__ = [
    "CATEGORIES",
    "PRESETS",
    "CoreFit",
    "FitReport",
    "Layout",
    "StepSpec",
    "StepTrace",
    "Target",
    "estimate",
    "find_target",
    "measure_single_device",
    "predict_single_device",
    "targets",
]
