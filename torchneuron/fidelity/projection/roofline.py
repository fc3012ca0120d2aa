"""Step time on a Trainium target: each op at its roofline, plus the layout's collectives."""

from __future__ import annotations

from dataclasses import dataclass

from ..fit.chips import Target
from ..fit.layout import Layout
from .op_costs import OpCost, StepCosts


@dataclass
class OpTime:
    name: str
    seconds: float
    bound: str  # "compute" or "memory"


@dataclass
class Projection:
    target: Target
    layout: Layout
    compute_seconds: float
    collective_seconds: float
    tokens_per_step: int  # across the whole layout
    flops_per_core: float
    ops: list[OpTime]

    @property
    def step_seconds(self) -> float:
        """No overlap of collectives with compute (an upper bound)."""
        return self.compute_seconds + self.collective_seconds

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_per_step / self.step_seconds

    @property
    def mfu(self) -> float:
        return self.flops_per_core / (self.step_seconds * self.target.peak_bf16_flops)


def _fp32_peak(target: Target) -> float:
    # The runtime's trn3 profile has no FP32 figure; AWS's Trainium3 architecture page gives
    # 183 TFLOP/s per chip, a little over a quarter of BF16, as on trn1 and trn2.
    return target.peak_fp32_flops or target.peak_bf16_flops * 183 / 671


def op_time(cost: OpCost, target: Target, tp: int) -> OpTime:
    low = cost.low_precision_flops / tp
    high = (cost.flops - cost.low_precision_flops) / tp
    compute = low / target.peak_bf16_flops + high / _fp32_peak(target)
    memory = cost.bytes / tp / target.hbm_bytes_per_s
    return OpTime(cost.name, max(compute, memory), "compute" if compute >= memory else "memory")


def collective_seconds(
    layout: Layout,
    target: Target,
    param_bytes: int,
    activation_bytes_per_layer: int,
    layers: int,
    training: bool,
) -> float:
    """Ring collectives over NeuronLink at the target's per-core link bandwidth."""
    bw = target.link_bytes_per_s
    if bw <= 0:
        return 0.0
    seconds = 0.0
    if layout.fsdp > 1:
        n = layout.fsdp
        shard_traffic = param_bytes / layout.tp * (n - 1) / n
        # all-gather in forward (and again in backward), reduce-scatter of gradients
        seconds += shard_traffic * (3 if training else 1) / bw
    if layout.tp > 1:
        n = layout.tp
        # two all-reduces per layer in forward (attention and MLP outputs), two in backward
        per = 2 * activation_bytes_per_layer * (n - 1) / n
        seconds += per * 2 * layers * (2 if training else 1) / bw
    if layout.dp > 1 and training:
        n = layout.dp
        seconds += 2 * param_bytes / (layout.tp * layout.fsdp) * (n - 1) / n / bw
    return seconds


def project(
    costs: StepCosts,
    target: Target,
    layout: Layout,
    tokens_per_replica: int,
    param_bytes: int,
    activation_bytes_per_layer: int,
    layers: int,
    training: bool,
) -> Projection:
    ops = sorted(
        (op_time(c, target, layout.tp) for c in costs.ops.values()), key=lambda o: -o.seconds
    )
    compute = sum(o.seconds for o in ops)
    comms = collective_seconds(
        layout, target, param_bytes, activation_bytes_per_layer, layers, training
    )
    tokens = tokens_per_replica * layout.fsdp * layout.dp
    return Projection(target, layout, compute, comms, tokens, costs.flops / layout.tp, ops)
