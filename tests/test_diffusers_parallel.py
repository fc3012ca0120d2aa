"""Diffusers tensor and context parallelism on neuron: 2 ranks (4 for unified context
parallelism) as torchrun starts them, one neuron device each (torchrun itself runs
examples/diffusers_pipeline.py --tp in tests/test_docs.py).

``transformer.enable_parallelism(config=TensorParallelConfig(tp_degree=2))`` for every model
whose transformer has a ``_tp_plan`` (FLUX.1, FLUX.2 and its Klein variant, Qwen-Image,
Qwen-Image 2.1) gives the one-device output. Tolerance: atol 1e-5 on outputs in [0, 1] (the
row-parallel layers sum two partial products with an all-reduce, which reorders a float
reduction; measured differences are 2e-7 to 5e-7).

``enable_parallelism(config=ContextParallelConfig(...))`` for every model whose transformer has
a ``_cp_plan`` (the pipelines of FLUX.1, FLUX.2, FLUX.2 Klein, Qwen-Image, Wan and MiniMax-H3,
and the transformers alone of LTX-Video, LTX-2, Helios and ChronoEdit, whose pipelines need
text encoders from the Hub: tests/support/cp_transformer_fixtures.py), Ulysses and ring,
gives the one-device output within the same tolerance (ring attention merges per-block
results through their logsumexp in float32; measured differences 0 to 6e-7); on 4 ranks,
unified (``ring_degree=2, ulysses_degree=2``) on every one of them.
"""

from __future__ import annotations

import re
from pathlib import Path

from support.diffusers_fixtures import CASES
from support.ranks import run_script

TP_CASES = [name for name, case in CASES.items() if case.tensor_parallel]
LINE = re.compile(r"rank (\d) (\w+) sharded=(\d+) max_diff=([0-9.e+-]+)")
CP_CASES = [name for name, case in CASES.items() if case.context_parallel]
CP_LINE = re.compile(r"rank (\d) (\w+) (ulysses|ring|unified) max_diff=([0-9.e+-]+)")


def _ranks(script: str, cases: list[str], logs: Path, ranks: int = 2) -> str:
    """tests/support/`script` on `ranks` ranks for `cases` as torchrun starts them, forked from
    a process that has imported torch (tests/support/ranks.py::run_script); their stdout."""
    return run_script(Path(__file__).parent / "support" / script, cases, ranks, logs)


def test_tensor_parallel_matches_one_device(tmp_path: Path) -> None:
    assert TP_CASES == ["flux", "flux2", "flux2_klein", "qwenimage", "qwenimage21"]
    stdout = _ranks("diffusers_tp_rank.py", TP_CASES, tmp_path)
    results = {(int(r), name): (int(n), float(d)) for r, name, n, d in LINE.findall(stdout)}
    assert set(results) == {(rank, name) for rank in (0, 1) for name in TP_CASES}, stdout
    for (rank, name), (sharded, diff) in results.items():
        assert sharded > 0, f"rank {rank}: no parameter of {name} was sharded"
        assert diff <= 1e-5, f"rank {rank} {name}: max difference {diff} vs one device"


def test_context_parallel_ring_and_ulysses_match_one_device(tmp_path: Path) -> None:
    assert CP_CASES == ["flux", "flux2", "flux2_klein", "qwenimage", "wan"]
    stdout = _ranks("diffusers_cp_rank.py", CP_CASES, tmp_path)
    results = {(int(r), name, mode): float(d) for r, name, mode, d in CP_LINE.findall(stdout)}
    # and MiniMax-H3's pipeline and four transformers alone (diffusers_cp_rank.py, 2 ranks only)
    models = [*CP_CASES, "minimax_h3", "ltx", "ltx2", "helios", "chronoedit"]
    expected = {(r, n, m) for r in (0, 1) for n in models for m in ("ulysses", "ring")}
    assert set(results) == expected, stdout
    for (rank, name, mode), diff in results.items():
        assert diff <= 1e-5, f"rank {rank} {name} {mode}: max difference {diff} vs one device"


def test_unified_context_parallel_on_four_ranks_matches_one_device(tmp_path: Path) -> None:
    """ContextParallelConfig(ring_degree=2, ulysses_degree=2): heads exchanged all-to-all within
    each pair of ranks, key/value blocks rotated in a ring between the pairs, on every model of
    the two-rank test (Wan at its second resolution, whose sequence divides into 4 shards)."""
    stdout = _ranks("diffusers_cp_rank.py", CP_CASES, tmp_path, ranks=4)
    results = {(int(r), name, mode): float(d) for r, name, mode, d in CP_LINE.findall(stdout)}
    models = [*CP_CASES, "minimax_h3", "ltx", "ltx2", "helios", "chronoedit"]
    assert set(results) == {(r, n, "unified") for r in range(4) for n in models}, stdout
    for (rank, name, mode), diff in results.items():
        assert diff <= 1e-5, f"rank {rank} {name} {mode}: max difference {diff} vs one device"
