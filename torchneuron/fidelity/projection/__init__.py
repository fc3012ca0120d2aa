"""Projected time of a training step or of inference on a Trainium or Inferentia2 instance.

Presets and configs go through the calibrated analytic model (analytic.py: per-engine layer
costs, collectives, the layout's schedule; five constants fitted on AWS's published figures,
which published.py checks it against). A script's own compiled graphs go through the same
engine model op by op (graphs.py). docs/fidelity.md §4–5 states the model and its error.
"""

from __future__ import annotations

from dataclasses import dataclass

from .analytic import (
    CALIBRATION,
    Breakdown,
    Calibration,
    InferenceEstimate,
    InferenceRequest,
    TrainingLayout,
    inference,
    training_step,
)
from .hardware import INSTANCES, Instance, find_instance
from .shapes import SHAPES, Shape, find_shape, shape_from_config


def resolve_shape(model: str) -> Shape:
    """A model's shape: a published model's name (shapes.SHAPES), a fit preset, a config.json
    or a checkpoint directory."""
    from ..fit.model_source import load_config

    try:
        return find_shape(model)
    except ValueError:
        pass
    try:
        return shape_from_config(load_config(model))
    except ValueError as error:
        raise ValueError(f"{error}; or one of the published models: {', '.join(SHAPES)}") from None


@dataclass(frozen=True)
class TrainingProjection:
    layout: TrainingLayout
    step: Breakdown  # seconds of one optimizer step, by kind
    model_flops: float  # of one step, the whole layout (6 x parameters x tokens + attention)

    @property
    def seconds(self) -> float:
        return self.step.total

    @property
    def tokens_per_s(self) -> float:
        return self.layout.global_batch * self.layout.seq / self.seconds

    @property
    def sequences_per_s(self) -> float:
        return self.layout.global_batch / self.seconds

    @property
    def mfu(self) -> float:
        """Model FLOPs per second over the BF16 Tensor-engine peak of the cores used."""
        lay = self.layout
        cores = lay.tp * lay.pp * lay.dp * lay.cp
        return self.model_flops / self.seconds / (cores * lay.instance.matmul_bf16_flops)


def model_flops(shape: Shape, tokens: int, seq: int) -> float:
    """Training FLOPs of `tokens` tokens in sequences of `seq`: 6 per parameter a token passes
    through (a mixture of experts' top-k experts, not all of them) and token, and
    attention's QK^T and AV (forward and backward: 3 x 4 x seq x hidden per token and layer,
    halved by a causal mask)."""
    attention = 12.0 * seq * shape.hidden * shape.layers * (0.5 if shape.causal else 1.0)
    return tokens * (6.0 * shape.active_parameters() + attention)


def project_training(
    shape: Shape, layout: TrainingLayout, cal: Calibration = CALIBRATION
) -> TrainingProjection:
    step = training_step(shape, layout, cal)
    return TrainingProjection(
        layout, step, model_flops(shape, layout.global_batch * layout.seq, layout.seq)
    )


def project_inference(
    shape: Shape, request: InferenceRequest, cal: Calibration = CALIBRATION
) -> InferenceEstimate:
    return inference(shape, request, cal)


__all__ = [
    "CALIBRATION",
    "INSTANCES",
    "Breakdown",
    "Calibration",
    "InferenceEstimate",
    "InferenceRequest",
    "Instance",
    "Shape",
    "TrainingLayout",
    "TrainingProjection",
    "find_instance",
    "model_flops",
    "project_inference",
    "project_training",
    "resolve_shape",
]
