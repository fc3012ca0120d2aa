"""python -m torchneuron.fidelity.projection: the command projects what the calibrated model
checked against AWS's figures projects (published.py), refuses layouts it cannot lay out, and
--script costs a script's own compiled graphs with the same engine model."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from torchneuron.fidelity.fit.model_source import load_config
from torchneuron.fidelity.projection import (
    CALIBRATION,
    InferenceRequest,
    TrainingLayout,
    find_instance,
    project_inference,
    project_training,
    resolve_shape,
    shapes,
)
from torchneuron.fidelity.projection.__main__ import main
from torchneuron.fidelity.projection.analytic import collective_phase_seconds, tile_efficiency
from torchneuron.fidelity.projection.graphs import (
    MATMULS_PER_LAYER,
    OpWork,
    op_breakdown,
    op_work,
)
from torchneuron.fidelity.projection.published import training_rows

# AWS's Llama-3.1-8B run on 32 trn1.32xlarge (aws_figures/training.csv, row T0200).
LLAMA_8B_RUN = (
    "llama-3.1-8b --seq 8192 --batch 1 --global-batch 1024 --tp 32 --dp 32 --sp --zero1 "
    "--checkpointing selective --dtype fp32 --autocast --chip trn1"
).split()


def test_command_projects_what_the_published_table_checks(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(LLAMA_8B_RUN) == 0
    out = capsys.readouterr().out
    (row,) = [r for r in training_rows() if r.id == "T0200"]
    line = next(line for line in out.splitlines() if line.startswith("trn1.32xlarge"))
    nodes, _, seq_per_s, tokens_per_s = line.split()[1:5]
    assert int(nodes) == 32
    assert float(seq_per_s) == pytest.approx(row.projected, abs=0.005)
    assert float(tokens_per_s.replace(",", "")) == pytest.approx(row.projected * 8192, rel=1e-4)


def test_inference_reports_ttft_tpot_and_skips_instances_too_small(capsys) -> None:  # type: ignore[no-untyped-def]
    argv = "llama-3-70b --inference --tp 32 --batch 4 --input-len 2048 --output-len 2048"
    assert main(argv.split()) == 0
    out = capsys.readouterr().out
    expected = project_inference(
        shapes.find_shape("llama-3-70b"),
        InferenceRequest(find_instance("trn1.32xlarge"), 32, 4, 2048, 2048),
    )
    line = next(line for line in out.splitlines() if line.startswith("trn1.32xlarge"))
    ttft, tpot, tokens = (float(v.replace(",", "")) for v in line.split()[1:4])
    assert ttft == pytest.approx(expected.ttft * 1e3, abs=0.05)
    assert tpot == pytest.approx(expected.tpot * 1e3, abs=0.005)
    assert tokens == pytest.approx(expected.output_tokens_per_s, abs=0.05)
    # inf2.48xlarge has 24 cores: skipped with the reason when not named, refused when named
    assert "not projected on inf2.48xlarge: tp 32 is more than the 24 cores" in out
    assert main([*argv.split(), "--chip", "inf2"]) == 2
    assert "tp 32 is more than the 24 cores of inf2.48xlarge" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ("llama-3.1-8b --tp 48 --chip trn1", "48 cores does not lay out on 2 x trn1.32xlarge"),
        ("llama-3.1-8b --chip trn3", "no instance for chip 'trn3'"),
        ("llama-3.1-8b --dp 2 --global-batch 3", "global batch 3 is not a multiple of dp 2"),
        ("llama-3.1-8b --batch 0", "micro_batch must be >= 1, got 0"),
        ("llama-3.1-8b --inference --pp 2", "--pp, --dp, --cp and --ep are 1"),
        ("llama-3.1-8b --inference --cp 2", "--pp, --dp, --cp and --ep are 1"),
        ("llama-3.1-8b --dp 2 --fsdp --zero1", "fsdp shards the optimizer state already"),
        ("llama-3.1-8b --seq 2048 --cp 3 --chip trn1", "does not split into cp 3 shards"),
        ("llama-3.1-8b --tp 32 --cp 2 --chip trn1", "tp 32 x cp 2 is more than the 32 cores"),
        ("llama-3.1-8b --dp 4 --ep 4 --chip trn1", "expert parallelism needs a mixture-of-experts"),
        ("mixtral-8x7b --tp 4 --dp 6 --ep 3 --chip trn1", "ep 3 does not divide the model's 8"),
        ("mixtral-8x7b --tp 8 --dp 4 --ep 3 --chip trn1", "ep 3 does not divide dp 4 x cp 1"),
        ("mixtral-8x7b --tp 32 --dp 2 --ep 2 --chip trn1", "ep 2 x tp 32 x pp 1 is more than"),
        ("no-such-model", "neither a preset"),
        ("", "name a model"),
    ],
)
def test_bad_inputs_are_refused_with_the_reason(argv: str, message: str, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(argv.split()) == 2
    assert message in capsys.readouterr().err


def test_layouts_use_part_of_one_instance_or_whole_instances() -> None:
    trn1 = find_instance("trn1.32xlarge")
    TrainingLayout(trn1, 1, 2048, 1, 4, tp=8, dp=4)  # 32 of 32
    TrainingLayout(trn1, 1, 2048, 1, 1, tp=8)  # 8 of 32
    with pytest.raises(ValueError, match="does not lay out on 2 x trn1.32xlarge"):
        TrainingLayout(trn1, 2, 2048, 1, 2, tp=16, dp=2)  # 32 of 64


def test_shape_of_a_config() -> None:
    assert resolve_shape("llama-3.1-8b") == shapes.SHAPES["llama-3.1-8b"]
    assert shapes.shape_from_config(load_config("llama-3.1-70b")) == shapes.SHAPES["llama-3-70b"]
    from transformers import BertConfig, GPT2Config

    gpt2 = shapes.shape_from_config(GPT2Config(n_embd=768, n_layer=12, n_head=12))
    assert (gpt2.ffn, gpt2.gated_mlp, gpt2.causal, gpt2.vocab) == (3072, False, True, 50257)
    bert = shapes.shape_from_config(BertConfig())
    assert shapes.SHAPES["bert-large"].causal is False and bert.causal is False
    assert (bert.hidden, bert.ffn, bert.gated_mlp) == (768, 3072, False)


def test_op_costs_closed_form() -> None:
    trn2 = find_instance("trn2.48xlarge")
    m, k, n = 512, 200, 384
    from torch.fx.experimental.proxy_tensor import make_fx

    a = torch.empty(m, k, dtype=torch.bfloat16)
    b = torch.empty(k, n, dtype=torch.bfloat16)
    traced = make_fx(lambda a, b: torch.add(torch.mm(a, b), 1.0), tracing_mode="fake")(a, b)
    mm, add = [w for w in map(op_work, traced.graph.nodes) if w is not None]
    assert (mm.name, mm.flops, mm.matmuls, mm.tile_dims) == ("aten.mm", 2 * m * k * n, 1, (k, n))
    peak = trn2.matmul_bf16_flops * CALIBRATION.matmul_efficiency
    tiles = (200 / 256) * (384 / 384)
    assert tile_efficiency(k, n) == pytest.approx(tiles)
    cost = op_breakdown(mm, trn2).parts
    assert cost["matmul"] == pytest.approx(2 * m * k * n / (peak * tiles))
    assert cost["overhead"] == pytest.approx(CALIBRATION.layer_overhead_s / MATMULS_PER_LAYER)
    assert (add.elements, add.bytes) == (m * n, 2 * (2 * m * n))
    cost = op_breakdown(add, trn2).parts
    assert sum(cost.values()) == pytest.approx(
        max(m * n / trn2.vector_elements_per_s, 4 * m * n / trn2.hbm_bytes_per_s)
    )
    reduce = OpWork("_c10d_functional.all_reduce", bytes=1 << 24, collective="all_reduce", ranks=8)
    phase = collective_phase_seconds(
        1 << 24, 8, trn2.link_bytes_per_s, trn2.hop_latency_s, CALIBRATION
    )
    assert op_breakdown(reduce, trn2).parts == {"collectives": 2 * phase}


SCRIPT = """
import sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM

config = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                     num_attention_heads=8, num_key_value_heads=4, vocab_size=1024)
torch.manual_seed(0)
model = LlamaForCausalLM(config).to("neuron")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
step = torch.compile(model, backend="neuron")
ids = torch.randint(0, 1024, (2, 128), device="neuron")
for _ in range(int(sys.argv[1])):
    step(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad()
"""


def test_script_graphs_projected_per_graph_and_per_step(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    html = tmp_path / "graphs.html"
    assert main(["--html", str(html), "--script", str(script), "3"]) == 0
    out = capsys.readouterr().out
    assert "2 neuron graph(s) compiled, 3 optimizer step(s)" in out
    graphs = [line.split() for line in out.splitlines() if line.startswith("[")]
    assert [(g[1], g[2]) for g in graphs] == [("forward", "3"), ("backward", "3")]
    # The graphs of a Llama step cost what the analytic model charges its forward and
    # backward (the optimizer runs eagerly, outside the graphs): the two differ in how they
    # count elementwise work (aten ops unfused against a layer's vector passes), which
    # measures 3-11% here; 25% bounds it.
    per_step = dict(
        part.rsplit(" ", 2)[:2]
        for part in out.split("per optimizer step: ")[1].splitlines()[0].split(", ")
    )
    shape = shapes.Shape(256, 2, 8, 4, 688, 1024)
    for name in ("trn1.32xlarge", "trn2.48xlarge"):
        layout = TrainingLayout(find_instance(name), 1, 128, 2, 2, precision="fp32")
        step = project_training(shape, layout).step
        analytic_ms = (step.total - step.parts["optimizer"]) * 1e3
        assert float(per_step[name]) == pytest.approx(analytic_ms, rel=0.25), name
    page = html.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and "<script" not in page
    assert main(["--script"]) == 2
    assert main(["--script", str(tmp_path / "missing.py")]) == 2
    assert "no script" in capsys.readouterr().err
