"""The analytic Trainium projection against AWS's published figures
(torchneuron/fidelity/projection/published.py): docs/fidelity.md's table is what the code
computes from the committed figures, the committed constants are what the fit gives, and bad
layouts are refused with the reason."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from torchneuron.fidelity.projection import published
from torchneuron.fidelity.projection.analytic import (
    CALIBRATION,
    InferenceRequest,
    TrainingLayout,
    inference,
    mean_attended_length,
)
from torchneuron.fidelity.projection.hardware import find_instance
from torchneuron.fidelity.projection.shapes import find_shape

DOCS = Path(__file__).resolve().parents[1] / "docs" / "fidelity.md"
BLOCK = re.compile(r"<!-- published:begin -->\n(.*?)<!-- published:end -->", re.S)


def test_docs_table_is_the_projection_of_the_committed_figures() -> None:
    rows = published.all_rows()
    expected = published.markdown(rows) + "\n\n```\n" + published.summary(rows) + "\n```\n"
    found = BLOCK.search(DOCS.read_text())
    assert found, "docs/fidelity.md has no published:begin/end block"
    assert found.group(1) == expected, (
        "docs/fidelity.md is stale: paste `python -m torchneuron.fidelity.projection.published "
        "--markdown` between the markers"
    )


def test_every_figure_names_its_source_and_has_a_model_shape() -> None:
    for name in ("training.csv", "inference.csv"):
        for row in published._load(name, newest_only=False):
            source = r"aws-neuron-sdk@[0-9a-f]{10}:\S+\.(csv|rst|md|ipynb):[\d,-]+"
            assert re.fullmatch(source, row["source"]), row
            find_shape(row["model"])
            find_instance(row["instance"])
    held_out = [r for r in published.all_rows() if not r.calibration]
    assert len(held_out) >= len(published.all_rows()) / 3  # the fit is judged on other rows


def test_committed_constants_are_what_the_fit_gives() -> None:
    fitted = published.calibrate()
    for field in dataclasses.fields(CALIBRATION):
        committed, refit = getattr(CALIBRATION, field.name), getattr(fitted, field.name)
        assert committed == pytest.approx(refit, rel=0.01), field.name


@pytest.mark.parametrize(
    "model, tp, heads, kv_heads",
    [
        ("Llama-2-70b", 4, 16, 2),  # 8 KV heads divided by tp
        ("Llama-2-70b", 32, 2, 1),  # tp a multiple of 8: one KV head replicated per rank
        ("Llama-2-70b", 12, 6, 6),  # neither divides: one KV head per query head (MHA)
        ("Llama-2-13b", 24, 2, 2),  # 40 heads padded to 48: two per rank
    ],
)
def test_heads_are_sharded_as_nxd_inference_shards_them(
    model: str, tp: int, heads: int, kv_heads: int
) -> None:
    shape = find_shape(model)
    assert (shape.heads_per_rank(tp), shape.kv_heads_per_rank(tp)) == (heads, kv_heads)


def test_transformers_neuronx_up_to_2_18_made_gqa_into_mha_when_tp_split_kv_heads() -> None:
    """Llama-3-8B (32 query heads, 8 KV heads) on inf2 at tp 24: transformers-neuronx up to SDK
    2.18 repeated the KV heads to the 32 query heads, padded to 48 (two a rank); NxD Inference
    and later transformers-neuronx keep one KV head a rank. At tp 8 both divide them."""
    shape = find_shape("Llama-3-8B")
    inst = find_instance("inf2.48xlarge")
    assert (shape.kv_heads_per_rank(24), shape.as_multi_head().kv_heads_per_rank(24)) == (1, 2)
    old = InferenceRequest(inst, 24, 8, 4096, 4096, kv_heads_as_query_heads=True)
    new = dataclasses.replace(old, kv_heads_as_query_heads=False)
    assert inference(shape, old) == inference(shape.as_multi_head(), new)
    assert inference(shape, old).tpot > 1.2 * inference(shape, new).tpot  # twice the KV reads
    divided = dataclasses.replace(old, tp=8)
    assert inference(shape, divided) == inference(
        shape, dataclasses.replace(divided, kv_heads_as_query_heads=False)
    )
    rows = published._load("inference.csv")
    assert {published._kv_heads_as_query_heads(r) for r in rows if r["sdk"] < "2.19"} == {True}
    assert not any(published._kv_heads_as_query_heads(r) for r in rows if r["sdk"] >= "2.19")


def test_a_throughput_contradicting_its_own_latencies_is_judged_against_them() -> None:
    rows = {r.id: r for r in published.inference_rows()}
    # Llama-2-13B on trn1, 8192 tokens in and out: 31.4 tok/s published; its P50 TTFT
    # (2,367.9 ms) and TPOT (13.408 ms) give 8192 tokens in 112.2 s, 73.0 tok/s.
    contradicted = rows["I0801"]
    assert contradicted.published == pytest.approx(31.399, rel=1e-4)
    assert contradicted.implied == pytest.approx(8192 / (2.367928505 + 8191 * 0.01340842247))
    assert contradicted.error == pytest.approx(contradicted.projected / contradicted.implied - 1)
    consistent = rows["I0802"]  # Llama-2-70B, 128 in and out: 39.3 both ways
    assert consistent.implied == 0.0 and consistent.reference == consistent.published
    # Mistral-7B on inf2, 4096 in and out: 81.7 tok/s published, 125.0 from the P50s, but its
    # P99 TPOT (11.65 ms against 7.87) gives 84.9: a tail, not a contradiction
    tail = rows["I0717"]
    assert tail.implied == 0.0 and tail.reference == pytest.approx(81.70, rel=1e-4)
    # decided from the published figures alone: another calibration judges the same rows
    other = dataclasses.replace(CALIBRATION, matmul_efficiency=0.9, hbm_efficiency=0.2)
    assert [r.id for r in published.inference_rows(other) if r.implied] == [
        r.id for r in rows.values() if r.implied
    ]


@pytest.mark.parametrize(
    "input_len, output_len, mean",
    [
        (100, 28, 128),  # every step in the first bucket, 128
        (128, 128, 256),  # positions 128-255: the 256 bucket
        (200, 400, (56 * 256 + 256 * 512 + 88 * 600) / 400),  # 256, 512, then the length 600
    ],
)
def test_decode_attends_its_token_generation_bucket(
    input_len: int, output_len: int, mean: float
) -> None:
    assert mean_attended_length(input_len, output_len) == pytest.approx(mean)


def test_decode_of_a_memory_bound_model_is_its_weights_over_hbm_bandwidth() -> None:
    """Llama-2-70B at batch 1 on 32 trn1 cores: each decode step reads every layer's weights;
    with the fixed costs zeroed and full bandwidths, TPOT is that, the LM head's weights, and
    each layer's four collective phases of one hop (Mesh: messages under 1 MB), within the
    KV cache's reads (the 128-token bucket) and the collectives' 16 KiB."""
    shape = find_shape("Llama-2-70b")
    inst = find_instance("trn1.32xlarge")
    bare = dataclasses.replace(
        CALIBRATION,
        hbm_efficiency=1.0,
        link_efficiency=1.0,
        layer_overhead_s=0.0,
        collective_overhead_s=0.0,
    )
    estimate = inference(shape, InferenceRequest(inst, 32, 1, 16, 2), bare)
    layer_weights = shape.layer_weights_per_rank(32)  # 8 KV heads replicated to one per rank
    closed_form = shape.layers * (layer_weights * 2 / inst.hbm_bytes_per_s)
    closed_form += shape.vocab * shape.hidden / 32 * 2 / inst.hbm_bytes_per_s
    closed_form += shape.layers * 4 * inst.hop_latency_s
    assert closed_form <= estimate.tpot <= closed_form * 1.01


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tp": 16, "dp": 4}, "64 cores does not lay out on 1 x trn1.32xlarge"),
        ({"nodes": 2}, "32 cores does not lay out on 2 x trn1.32xlarge"),
        ({"micro_batch": 0}, "micro_batch must be >= 1"),
        ({"global_batch": 102}, "not a multiple of dp"),
        ({"checkpointing": "some"}, "none, selective or full"),
        ({"precision": "fp8"}, "bf16, mixed or fp32"),
    ],
)
def test_bad_layouts_are_refused_with_the_reason(changes: dict, message: str) -> None:
    layout = dict(
        instance=find_instance("trn1.32xlarge"), nodes=1, seq=2048, micro_batch=1,
        global_batch=64, tp=8, dp=4,
    )  # fmt: skip
    with pytest.raises(ValueError, match=message):
        TrainingLayout(**{**layout, **changes})


def test_unknown_models_and_instances_are_named() -> None:
    with pytest.raises(ValueError, match="no shape for 'gpt-5'"):
        find_shape("gpt-5")
    with pytest.raises(ValueError, match="unknown instance 'trn9'"):
        find_instance("trn9")


def test_html_plots_every_figure_against_its_projection(tmp_path: Path) -> None:
    page = tmp_path / "published.html"
    assert published.main(["--html", str(page)]) == 0
    text = page.read_text()
    training, inference_plot = re.findall(r"<svg.*?</svg>", text, re.S)[:2]
    rows = published.all_rows()
    for svg, kind in ((training, "training"), (inference_plot, "inference")):
        chosen = [r for r in rows if r.kind == kind]
        tips = re.findall(r"<title>(\S+) ", svg)
        assert sorted(tips) == sorted(r.id for r in chosen)
    assert "<script" not in text
