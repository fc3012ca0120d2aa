"""Context parallelism, FSDP (ZeRO-3), mixtures of experts and expert parallelism in the
analytic projection, against closed forms: what each shards, what it sends, and how much of
it the schedule hides.

AWS publishes no training figure with these layouts (torchneuron/fidelity/projection/
aws_figures/training.csv), so these mechanisms are not calibrated; their costs use the
constants fitted on the other layouts. The published table is unchanged by them
(tests/test_projection_published.py recomputes it). The layouts the command refuses are in
tests/test_projection.py's refusal cases.
"""

from __future__ import annotations

import dataclasses

import pytest

from torchneuron.fidelity.projection import find_instance, shapes
from torchneuron.fidelity.projection.__main__ import main
from torchneuron.fidelity.projection.analytic import (
    CALIBRATION,
    TrainingLayout,
    collective_phase_seconds,
    context_exchange_seconds,
    fsdp_layer_seconds,
    training_step,
)

TRN1 = find_instance("trn1.32xlarge")
LLAMA = shapes.SHAPES["llama-3.1-8b"]


def _layout(**fields: object) -> TrainingLayout:
    base = dict(instance=TRN1, nodes=1, seq=8192, micro_batch=1, global_batch=1, tp=8)
    base.update(fields)
    return TrainingLayout(**base)  # type: ignore[arg-type]


def test_context_parallel_splits_every_token_wise_cost_by_cp() -> None:
    """cp ranks each hold seq / cp tokens: projections, the LM head, elementwise work and
    (load-balanced causal) attention all divide by cp; the gradients of the cp ranks, which
    hold the same weights, are all-reduced as data parallelism's are."""
    one = training_step(LLAMA, _layout())
    for cp in (2, 4):
        split = training_step(LLAMA, _layout(cp=cp))
        for kind in ("matmul", "attention", "vector"):
            assert split.parts[kind] == pytest.approx(one.parts[kind] / cp, rel=1e-12), kind
        assert "dp collectives" in split.parts and "dp collectives" not in one.parts


def test_ring_sends_kv_blocks_and_hides_them_behind_attention() -> None:
    """cp - 1 ring steps of a rank's key and value blocks (seq / cp tokens x 2 x its KV heads
    x head_dim x 2 bytes); exposed only when they outlast the attention: never at 8k tokens
    on NeuronLink, and 3 x (ring - attention) a layer (forward, and twice both in the
    backward) when the link is made a millionth as fast."""
    layout = _layout(cp=4)
    block = 8192 / 4 * 2 * LLAMA.kv_heads_per_rank(8) * LLAMA.head_dim * 2
    step = block / (TRN1.link_bytes_per_s * CALIBRATION.link_efficiency) + TRN1.hop_latency_s
    ring = context_exchange_seconds(LLAMA, layout, 2, CALIBRATION)
    assert ring == pytest.approx(3 * (step + CALIBRATION.collective_overhead_s), rel=1e-12)
    assert training_step(LLAMA, layout).parts["cp exchange"] == 0.0

    slow = dataclasses.replace(CALIBRATION, link_efficiency=CALIBRATION.link_efficiency * 1e-6)
    slow_ring = context_exchange_seconds(LLAMA, layout, 2, slow)
    parts = training_step(LLAMA, layout, slow).parts
    attention_fwd = parts["attention"] / 3 / LLAMA.layers
    expected = LLAMA.layers * 3 * (slow_ring - attention_fwd)
    assert parts["cp exchange"] == pytest.approx(expected, rel=1e-9)


def test_fsdp_shards_state_over_dp_and_gathers_each_layer() -> None:
    """FSDP: optimizer state over dp (as ZeRO-1 shards it), no step-end gradient sync, and per
    microbatch each layer's parameters gathered (BF16) for forward and backward and its
    gradients reduce-scattered (FP32 under mixed precision), behind the neighbouring layers'
    compute: at 8k tokens only the first gather of each pass and the last reduce-scatter are
    exposed, 2 x gather + scatter per microbatch."""
    fsdp = _layout(dp=4, global_batch=8, fsdp=True, precision="mixed")
    zero1 = _layout(dp=4, global_batch=8, zero1=True, precision="mixed")
    a, b = training_step(LLAMA, fsdp).parts, training_step(LLAMA, zero1).parts
    assert a["optimizer"] == pytest.approx(b["optimizer"], rel=1e-12)
    assert "dp collectives" not in a and "dp collectives" in b

    weights = LLAMA.layer_weights_per_rank(8)
    link, hop = TRN1.link_bytes_per_s, TRN1.hop_latency_s
    gather = collective_phase_seconds(weights * 2, 4, link, hop, CALIBRATION)
    scatter = collective_phase_seconds(weights * 4, 4, link, hop, CALIBRATION)
    assert fsdp_layer_seconds(LLAMA, fsdp, CALIBRATION) == pytest.approx((gather, scatter))
    microbatches = fsdp.microbatches
    assert microbatches == 2
    assert a["fsdp collectives"] == pytest.approx(microbatches * (2 * gather + scatter), rel=1e-9)


def test_command_prints_the_layout_and_its_collectives(capsys) -> None:  # type: ignore[no-untyped-def]
    argv = "llama-3.1-8b --seq 8192 --tp 8 --dp 2 --cp 2 --fsdp --global-batch 4 --chip trn1"
    assert main(argv.split()) == 0
    out = capsys.readouterr().out
    assert "tp 8 pp 1 dp 2 cp 2 fsdp" in out
    assert "fsdp collectives" in out
    assert "dp collectives" not in out.replace("fsdp collectives", "")


MIXTRAL = shapes.SHAPES["mixtral-8x7b"]


def test_mixture_of_experts_counts_its_experts() -> None:
    """Mixtral-8x7B: 46.7B parameters, 12.9B a token passes through (Mistral AI's figures for
    it); a token's projections go through the router and its top-2 experts; a decode step of
    one token reads 2 experts' weights, of 64 tokens nearly all 8 (8 x (1 - (6/8)^64))."""
    assert MIXTRAL.parameters() / 1e9 == pytest.approx(46.7, abs=0.05)
    assert MIXTRAL.active_parameters() / 1e9 == pytest.approx(12.9, abs=0.05)
    h, expert = 4096, 3 * 4096 * 14336
    attention = 2 * h * 4 * 128 + 2 * h * 1 * 128  # tp 8: 4 query heads, 1 KV head a rank
    router = h * 8
    flops = MIXTRAL.layer_matmul_flops(16, 8)
    assert flops == 2.0 * 16 * (attention + router + 2 * expert // 8)
    one = MIXTRAL.layer_decode_weights_per_rank(8, 1)
    assert one == pytest.approx(attention + router + 2 * expert / 8)
    many = MIXTRAL.layer_decode_weights_per_rank(8, 64)
    assert many == pytest.approx(attention + router + 8 * (1 - 0.75**64) * expert / 8)
    assert MIXTRAL.layer_weights_per_rank(8, ep=4) == attention + router + 2 * expert // 8


def test_shape_of_a_mixture_of_experts_config() -> None:
    from transformers import MixtralConfig, Qwen2MoeConfig

    mixtral = shapes.shape_from_config(MixtralConfig())
    assert (mixtral.experts, mixtral.experts_per_token, mixtral.ffn) == (8, 2, 14336)
    qwen = shapes.shape_from_config(Qwen2MoeConfig())  # the expert MLP's own width
    assert (qwen.experts, qwen.experts_per_token, qwen.ffn) == (60, 4, 1408)


def test_expert_parallelism_sends_tokens_to_their_experts_and_shards_them() -> None:
    """ep ranks each hold experts / ep; per layer four all-to-alls (dispatch and combine,
    forward and backward) of each rank's tokens x top-k x hidden x 2 bytes, exposed; the
    experts' optimizer state divided by ep."""
    base = dict(instance=TRN1, nodes=1, seq=4096, micro_batch=1, global_batch=4, tp=8, dp=4)
    sharded = training_step(MIXTRAL, TrainingLayout(**base, ep=4))  # type: ignore[arg-type]
    whole = training_step(MIXTRAL, TrainingLayout(**base))  # type: ignore[arg-type]
    phase = collective_phase_seconds(
        4096 * 2 * 4096 * 2, 4, TRN1.link_bytes_per_s, TRN1.hop_latency_s, CALIBRATION
    )
    assert sharded.parts["ep all-to-all"] == pytest.approx(32 * 4 * phase, rel=1e-12)
    assert whole.parts["ep all-to-all"] == 0.0
    held = MIXTRAL.parameters() - MIXTRAL.expert_parameters() * 3 / 4
    ratio = sharded.parts["optimizer"] / whole.parts["optimizer"]
    assert ratio == pytest.approx(held / MIXTRAL.parameters(), rel=1e-12)
    assert sharded.parts["matmul"] == whole.parts["matmul"]  # the same expert work a rank
