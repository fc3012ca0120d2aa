"""torchneuron.fidelity.projection: op costs against closed forms, roofline, and a model
projection."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from torchneuron.fidelity.fit import Layout, StepSpec, find_target
from torchneuron.fidelity.projection import project_step
from torchneuron.fidelity.projection.op_costs import OpCostMode
from torchneuron.fidelity.projection.roofline import collective_seconds, op_time


def test_matmul_flops_bytes_and_roofline_closed_form() -> None:
    m, k, n = 2048, 2048, 2048  # 683 FLOP/byte: above trn2's ridge (230 per logical core)
    with FakeTensorMode():
        a = torch.empty(m, k, dtype=torch.bfloat16, device="neuron")
        b = torch.empty(k, n, dtype=torch.bfloat16, device="neuron")
        with OpCostMode() as mode:
            a @ b
    mm = mode.costs.ops["aten.mm"]
    assert mm.flops == mm.low_precision_flops == 2 * m * k * n
    assert mm.bytes == 2 * (m * k + k * n + m * n)
    trn2 = find_target("trn2")
    assert trn2.peak_bf16_flops == pytest.approx(667e12 / 4)  # LNC=2: a quarter chip
    t = op_time(mm, trn2, tp=1)
    expected = max(mm.flops / trn2.peak_bf16_flops, mm.bytes / trn2.hbm_bytes_per_s)
    assert t.seconds == pytest.approx(expected) and t.bound == "compute"
    assert op_time(mm, trn2, tp=2).seconds == pytest.approx(expected / 2)


def test_collectives_ring_closed_form() -> None:
    trn2 = find_target("trn2")
    fsdp = collective_seconds(
        Layout(fsdp=4),
        trn2,
        param_bytes=1 << 30,
        activation_bytes_per_layer=0,
        layers=1,
        training=True,
    )
    assert fsdp == pytest.approx(3 * (1 << 30) * 3 / 4 / trn2.link_bytes_per_s)
    assert collective_seconds(Layout(), trn2, 1 << 30, 1 << 20, 4, True) == 0.0


def test_projection_of_a_model_step() -> None:
    spec = StepSpec(batch=2, seq=128, dtype="bf16")
    (one,) = project_step("tiny-llama", spec, Layout(), ["trn2"])
    (two,) = project_step("tiny-llama", spec, Layout(dp=2), ["trn2"])
    assert one.tokens_per_step == 256 and two.tokens_per_step == 512
    assert one.tokens_per_second == pytest.approx(256 / one.step_seconds)
    assert 0 < one.mfu < 1 and one.collective_seconds == 0 < two.collective_seconds
    assert one.ops[0].seconds >= one.ops[-1].seconds  # slowest first


def test_cli_text_and_html(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from torchneuron.fidelity.projection.__main__ import main

    html = tmp_path / "projection.html"
    argv = ["tiny-llama", "--seq", "64", "--chip", "trn1", "--fsdp", "2", "--html", str(html)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "trn1 (LNC=1)" in out and "tokens/s" in out and "slowest ops" in out
    text = html.read_text()
    assert text.startswith("<!DOCTYPE html>") and "<svg" in text and "<script" not in text
    assert main(["tiny-llama", "--batch", "0"]) == 2
    assert "batch and seq must be >= 1" in capsys.readouterr().err
