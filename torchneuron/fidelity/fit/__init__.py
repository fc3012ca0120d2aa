"""Will it fit? Peak HBM per logical core of a training or inference step on Trainium.

One step is traced with fake tensors (nothing is allocated), the live bytes followed over
time as the caching allocator would count them, and the peak broken down by category; a
layout (tp, fsdp, dp) then divides what it shards, or, with ``traced=True`` (``--traced``),
the layout itself (tp, fsdp, dp, pp) is applied with PyTorch's APIs under a fake process group
and one rank per pipeline stage is traced (``sharded.py``).
``python -m torchneuron.fidelity.fit --help``.
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
    traced_ranks: dict[int, StepTrace] = field(default_factory=dict)  # --traced: rank -> trace

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "spec": self.trace.spec.__dict__,
            "layout": self.layout.__dict__,
            "single_device_peak_bytes": self.trace.peak_bytes,
            "traced_rank_peak_bytes": {r: t.peak_bytes for r, t in self.traced_ranks.items()},
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
    traced: bool = False,
) -> FitReport:
    """Fit of ``model`` (preset, config.json or checkpoint dir) for ``spec`` under ``layout``.

    ``spec.batch`` is one data-parallel replica's micro-batch. ``chips`` selects targets
    ('trn2', 'trn2:1'); default: every chip at every logical-core grouping. ``traced``: the
    layout is traced (the first rank of each pipeline stage: even splits make every rank of
    a stage alike, uneven ones give the first ranks the larger shards) and the largest of
    those peaks is the fit; otherwise the single-device trace is rescaled. The smallest
    fitting layout is always found by rescaling.
    """
    spec = spec or StepSpec()
    layout = layout or Layout()
    config = load_config(model)
    trace = predict_single_device(config, spec)
    shape = model_shape(trace)
    chosen: list[Target] = [find_target(c) for c in chips] if chips else targets()
    ranks: dict[int, StepTrace] = {}
    if traced:
        from .sharded import predict_sharded, stage_first_ranks

        if not spec.training:
            raise ValueError("--traced traces training steps only")
        ranks = {r: predict_sharded(config, spec, layout, r) for r in stage_first_ranks(layout)}
        worst = max(ranks.values(), key=lambda t: t.peak_bytes)
        fits = [CoreFit(layout, t, dict(worst.breakdown)) for t in chosen]
    else:
        fits = [fit(trace, layout, t, shape) for t in chosen]
    smallest = {t.name: smallest_fitting_layout(trace, t, shape, max_cores) for t in chosen}
    return FitReport(model, trace, layout, fits, smallest, ranks)


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
