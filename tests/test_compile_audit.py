"""torchneuron.fidelity.compile_audit: the graphs a run compiles on neuron, why, and the
buckets advice."""

from __future__ import annotations

import json

import pytest
import torch

from torchneuron.fidelity.compile_audit import advise_buckets, audit, next_bucket


@pytest.fixture(autouse=True)
def fresh_dynamo() -> None:
    torch._dynamo.reset()


def test_audit_lists_each_signature_with_its_reason() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return (x * 2).sum(-1)

    compiled = torch.compile(f, backend="neuron", fullgraph=True)
    sizes = [3, 4, 4, 3]  # both pad to the bucket 4
    with audit() as result:
        for n in sizes:
            out = compiled(torch.ones(2, n, device="neuron"))
            assert torch.equal(out.cpu(), torch.full((2,), 2.0 * n))
    assert result.compiles == len(set(sizes)) == 2
    assert result.host_graphs == 2  # inference graphs: one NEFF each
    assert [g.signature[0][1] for g in result.graphs] == [(2, 3), (2, 4)]
    assert result.graphs[0].reason == "first compile of this frame"
    assert "changed from shape (2, 3) to (2, 4)" in result.graphs[1].reason
    assert "test_compile_audit.py" in result.graphs[0].code
    (advice,) = result.advice
    assert advice.graphs_now == 2 and advice.graphs_with_buckets == 1
    assert "-> 1 with buckets" in result.format()


def test_frames_after_a_dynamo_reset_are_new_frames() -> None:
    """Dynamo numbers frames from 0 again after torch._dynamo.reset(): the first compile of a
    frame after it is no recompile, whatever frame held that number before."""

    def before(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    def after(x: torch.Tensor) -> torch.Tensor:
        return x * 3

    torch.compile(before, backend="neuron", fullgraph=True)(torch.ones(5, device="neuron"))
    torch._dynamo.reset()
    with audit() as result:
        out = torch.compile(after, backend="neuron", fullgraph=True)(torch.ones(2, device="neuron"))
    assert torch.equal(out.cpu(), torch.full((2,), 3.0))
    assert [g.reason for g in result.graphs] == ["first compile of this frame"]
    assert "changed from shape" not in result.format()


def test_training_graphs_count_forward_and_backward() -> None:
    model = torch.nn.Linear(8, 4).to("neuron")
    compiled = torch.compile(model, backend="neuron", fullgraph=True)
    with audit() as result:
        for _ in range(2):
            compiled(torch.ones(3, 8, device="neuron")).sum().backward()
    assert result.compiles == 1 and result.host_graphs == 2  # a forward and a backward graph
    assert json.loads(result.to_json())["neuron_compiles"] == 2


def test_next_bucket_and_advice_closed_forms() -> None:
    assert [next_bucket(n) for n in (1, 3, 64, 65, 127, 128, 129, 300)] == [
        1,
        4,
        64,
        128,
        128,
        128,
        256,
        384,
    ]
    sigs = [[("x", (2, n), "f32"), ("m", (2, n), "i64")] for n in (100, 200, 250, 256)]
    advice = advise_buckets("f", sigs)
    assert [(name, dim) for name, dim, _ in advice.varying] == [("x", 1), ("m", 1)]
    assert advice.graphs_now == 4 and advice.graphs_with_buckets == 2
    assert advice.buckets[("x", 1)] == [128, 256]


def test_cli_runs_a_script(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from torchneuron.fidelity.compile_audit.__main__ import main

    script = tmp_path / "gen.py"
    script.write_text(
        "import sys, torch\n"
        "def f(x):\n"
        "    return (x * 2).sum(-1)\n"
        "g = torch.compile(f, backend='neuron', fullgraph=True)\n"
        "for n in sys.argv[1:]:\n"
        "    g(torch.ones(2, int(n), device='neuron'))\n"
    )
    assert main(["--json", str(script), "3", "4", "3"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["compiles"] == 2 and out["bucketing"][0]["graphs_with_buckets"] == 1
