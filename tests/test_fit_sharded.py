"""torchneuron.fidelity.fit, traced layouts: each rank's predicted peak against the device's.

The prediction traces one rank of the layout in this process (FSDP2, tensor parallelism,
DDP, pipeline stages applied with PyTorch's APIs under a fake process group and
FakeTensorMode); the measurement runs the same model, step and layout under torchrun on
``neuron`` and reads each rank's ``torch.neuron.max_memory_allocated()`` over the step. They
must agree within 5% per rank (the issue's bar). The whole table, with more layouts:
``python -m torchneuron.fidelity.fit.sharded_check``.

Measured (tiny-llama, fp32, AdamW, batch 2 x 128; docs/fidelity.md has the table): every rank
of fsdp2, tp2, dp2 (DDP) and pp2 (1F1B) within 0.002%; the only differences (512 B to 1 KiB on
some tp and pp ranks) come from the asynchronous launches, whose kernels' scratch blocks can
overlap the peak or not from one run to the next. The 4-rank compositions (fsdp2 x tp2,
dp2 x fsdp2, dp2 x tp2, pp2 x tp2, pp2 x fsdp2), measured as closely, are left to the command
above: a 4-rank job costs about 30 s of CPU more than this file's budget.
Cost: one torchrun job of 2 ranks; about 40 s of CPU, 35 s on 2 cores.
"""

from __future__ import annotations

import json

import pytest

from torchneuron.fidelity.fit import Layout, StepSpec
from torchneuron.fidelity.fit.model_source import load_config
from torchneuron.fidelity.fit.sharded import predict_sharded, stage_first_ranks
from torchneuron.fidelity.fit.sharded_check import check_layouts, format_table, parse_layout
from torchneuron.fidelity.fit.trace import predict_single_device

TOLERANCE = 0.05  # relative, per rank
SPEC = StepSpec(batch=2, seq=128)
LAYOUTS = [Layout(fsdp=2), Layout(tp=2), Layout(dp=2), Layout(pp=2)]


def test_traced_layouts_match_each_ranks_measured_peak() -> None:
    rows = check_layouts("tiny-llama", SPEC, LAYOUTS)
    print("\n" + format_table(rows))
    assert len(rows) == sum(layout.cores for layout in LAYOUTS)
    for row in rows:
        assert abs(row.error) <= TOLERANCE, row


def test_traced_states_are_sharded_as_the_layout_says() -> None:
    config = load_config("tiny-llama")
    whole = predict_single_device(config, SPEC).breakdown["parameters"]
    fsdp = predict_sharded(config, SPEC, Layout(fsdp=2)).breakdown["parameters"]
    assert fsdp == pytest.approx(whole / 2, rel=0.01)  # FSDP2: each rank holds half
    # Pipeline stages: the first holds the embedding, the last the norm and the LM head.
    first, last = (predict_sharded(config, SPEC, Layout(pp=2), r) for r in (0, 1))
    assert first.breakdown["parameters"] + last.breakdown["parameters"] == pytest.approx(
        whole, rel=0.001
    )
    assert last.peak_bytes > first.peak_bytes  # the logits live on the last stage
    assert stage_first_ranks(Layout(pp=2, tp=2, fsdp=2)) == [0, 4]
    assert parse_layout("pp2xtp2") == Layout(pp=2, tp=2)
    with pytest.raises(ValueError, match="must divide"):
        predict_sharded(config, SPEC, Layout(tp=3))


def test_cli_traced(capsys) -> None:  # type: ignore[no-untyped-def]
    from torchneuron.fidelity.fit.__main__ import main

    argv = ["tiny-llama", "--batch", "2", "--seq", "64", "--dtype", "fp32", "--pp", "2"]
    argv += ["--chip", "trn2"]
    assert main([*argv, "--traced", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["layout"] == {"tp": 1, "fsdp": 1, "dp": 1, "pp": 2}
    peaks = out["traced_rank_peak_bytes"]
    assert set(peaks) == {"0", "1"} and out["targets"][0]["peak_bytes"] == max(peaks.values())
    assert main(argv) == 2  # pipeline layouts are traced only
    assert "--pp needs --traced" in capsys.readouterr().err
