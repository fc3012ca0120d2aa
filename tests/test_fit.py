"""torchneuron.fidelity.fit: the fake-tensor prediction of a step's peak against the device's
measure.

The prediction traces the step under FakeTensorMode (nothing allocated); the measurement runs
the same step on neuron:0 and reads torch.neuron.max_memory_allocated(). They must agree
within 5% (the issue's bar); the layout rules are checked against closed forms.
"""

from __future__ import annotations

import json

import pytest
import torch

from torchneuron.fidelity.fit import Layout, StepSpec, estimate, find_target
from torchneuron.fidelity.fit.layout import ModelShape, per_core_breakdown
from torchneuron.fidelity.fit.model_source import load_config
from torchneuron.fidelity.fit.trace import measure_single_device, predict_single_device
from torchneuron.fidelity.fit.tracker import block_bytes

TOLERANCE = 0.05  # relative, prediction vs measured peak

CASES = {
    "adamw-fp32-train": StepSpec(batch=2, seq=128),
    "adamw-bf16-autocast-activation-peak": StepSpec(batch=4, seq=256, autocast=True),
    "sgd-grad-checkpointing": StepSpec(batch=4, seq=256, optimizer="sgd", grad_checkpointing=True),
    "inference-static-kv-cache": StepSpec(batch=2, seq=256, training=False, new_tokens=4),
}


@pytest.mark.parametrize("name", list(CASES))
def test_prediction_matches_measured_peak(name: str) -> None:
    config = load_config("tiny-llama")
    spec = CASES[name]
    predicted = predict_single_device(config, spec)
    measured = measure_single_device(config, spec)
    error = abs(predicted.peak_bytes - measured) / measured
    print(f"{name}: predicted {predicted.peak_bytes} measured {measured} error {error:.4%}")
    assert error <= TOLERANCE, (name, predicted.peak_bytes, measured)
    assert sum(predicted.breakdown.values()) == predicted.peak_bytes
    # The categories are what they should be: weights, and Adam's two moments per weight.
    params = sum(p.numel() for p in _tiny_params(config, spec)) * spec.torch_dtype.itemsize
    assert predicted.breakdown["parameters"] == pytest.approx(params, rel=0.01)
    if not spec.training:
        assert predicted.breakdown["kv_cache"] > 0 and predicted.breakdown["gradients"] == 0


def _tiny_params(config: object, spec: StepSpec) -> list[torch.nn.Parameter]:
    from torchneuron.fidelity.fit.model_source import build_model

    return list(build_model(config, spec.torch_dtype, device="meta").parameters())


def test_adamw_state_is_two_moments_and_activations_peak_with_long_sequences() -> None:
    config = load_config("tiny-llama")
    short = predict_single_device(config, StepSpec(batch=1, seq=64))
    n_bytes = short.breakdown["parameters"]
    # exp_avg and exp_avg_sq per parameter (+ one step counter per parameter, 512 B blocks)
    assert short.breakdown["optimizer_state"] == pytest.approx(2 * n_bytes, rel=0.02)
    assert short.breakdown["gradients"] == pytest.approx(n_bytes, rel=0.01)
    long = predict_single_device(config, StepSpec(batch=4, seq=256))
    assert long.breakdown["activations"] > long.breakdown["optimizer_state"]


def test_block_bytes_follows_the_allocator_rounding() -> None:
    assert block_bytes(0) == 0
    assert block_bytes(1) == 512
    assert block_bytes(513) == 1024
    assert block_bytes(11 << 20) == 12 << 20  # 1 MiB left of a 12 MiB segment: not split
    assert block_bytes((10 << 20) + 512) == (10 << 20) + 512  # 1.5 MiB left: split


def test_layout_shards_states_and_adds_collective_buffers() -> None:
    config = load_config("tiny-llama")
    trace = predict_single_device(config, StepSpec(batch=1, seq=64))
    shape = ModelShape(
        trace.hidden_size, trace.num_kv_heads, trace.num_heads, trace.largest_layer_param_bytes
    )
    one = per_core_breakdown(trace, Layout(), shape)
    assert one == trace.breakdown  # the identity layout is the traced single device
    four = per_core_breakdown(trace, Layout(fsdp=4), shape)
    for kind in ("parameters", "gradients", "optimizer_state"):
        assert four[kind] == pytest.approx(one[kind] / 4, rel=0.02)
    # FSDP: two gathered layers (prefetch) + one layer's gradients for the reduce-scatter.
    assert four["collective_buffers"] == 3 * trace.largest_layer_param_bytes
    assert per_core_breakdown(trace, Layout(dp=2), shape)["collective_buffers"] == 2 * (25 << 20)


def test_estimate_finds_the_smallest_layout_that_fits() -> None:
    report = estimate(
        "small-llama", StepSpec(batch=4, seq=1024, dtype="bf16"), chips=["trn1", "trn2:1", "trn2:2"]
    )
    by_name = {f.target.name: f for f in report.fits}
    assert by_name["trn2 (LNC=2)"].target.hbm_bytes == 24 << 30
    assert by_name["trn2 (LNC=1)"].target.hbm_bytes == 12 << 30
    assert by_name["trn1 (LNC=1)"].target.hbm_bytes == 16 << 30
    for name, best in report.smallest.items():
        assert best is not None and best.fits
        # Nothing with fewer cores fits: the search is smallest-first.
        assert best.layout.cores == 1 or not any(
            f.fits for f in _fits_with_fewer_cores(report, name, best.layout.cores)
        )
    # Less HBM per core never needs fewer cores.
    assert (
        report.smallest["trn2 (LNC=1)"].layout.cores >= report.smallest["trn2 (LNC=2)"].layout.cores
    )


def _fits_with_fewer_cores(report, name: str, cores: int):  # type: ignore[no-untyped-def]
    from torchneuron.fidelity.fit import model_shape
    from torchneuron.fidelity.fit.layout import candidate_layouts, fit

    target = next(f.target for f in report.fits if f.target.name == name)
    shape = model_shape(report.trace)
    return [fit(report.trace, lay, target, shape) for lay in candidate_layouts(shape, cores // 2)]


def test_cli_json_html_and_bad_input(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from torchneuron.fidelity.fit.__main__ import main

    config = tmp_path / "config.json"
    fields = {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "vocab_size": 512,
    }
    config.write_text(json.dumps(fields))
    html = tmp_path / "fit.html"
    argv = [
        str(config),
        "--seq",
        "64",
        "--fsdp",
        "2",
        "--chip",
        "trn2",
        "--json",
        "--html",
        str(html),
    ]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["layout"] == {"tp": 1, "fsdp": 2, "dp": 1, "pp": 1}
    assert out["targets"][0]["target"] == "trn2 (LNC=2)" and out["targets"][0]["fits"]
    text = html.read_text()
    assert text.startswith("<!DOCTYPE html>") and "<svg" in text and "<script" not in text
    assert main(["no-such-model"]) == 2
    assert "neither a preset" in capsys.readouterr().err
    with pytest.raises(ValueError, match="unknown chip"):
        find_target("trn9")
