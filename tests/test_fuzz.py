"""Fuzzing of the public entry points (issue 11): a bounded run of every target.

``devtools.fuzz`` drives torch.neuron's functions, the RNG state, streams and
events, tensor factories and copies (every dtype, odd strides and devices), the compile
backend, the environment variables of the README and 2-rank collectives with generated
input; its oracle (fuzz_oracle.py) accepts only success equal to the CPU's (or to the
documented meaning of the argument) or an expected exception type with a message. The runs
here are derandomized with a fixed number of cases, so they are the same on every run; the
long run is ``python -m devtools.fuzz --examples N``. The in-process targets run in
one child interpreter, so a crash or a hang is reported with the case that caused it (the
self-test targets check that the harness does).
"""

from __future__ import annotations

import pytest

from devtools import fuzz

IN_PROCESS_CASES = {
    "torch.neuron device functions": 150,
    "torch.neuron RNG state and seeds": 60,
    "torch.neuron streams and events": 100,
    "tensor factories": 150,
    "tensor copies and views": 150,
    "torch.compile backend=neuron": 12,
}


@pytest.fixture(scope="module")
def in_process_reports() -> dict[str, fuzz.TargetReport]:
    return {r.name: r for r in fuzz.run_isolated(IN_PROCESS_CASES, timeout=600)}


@pytest.mark.parametrize("target", sorted(IN_PROCESS_CASES))
def test_target_finds_nothing(target, in_process_reports):
    report = in_process_reports[target]
    assert report.findings == [], "\n\n".join(report.findings)
    assert report.cases >= 0.9 * IN_PROCESS_CASES[target], report


def test_environment_variables():
    """Six interpreters, each with one README variable set to a generated value."""
    (report,) = fuzz.run_isolated({"environment variables": 6}, timeout=600)
    assert report.findings == [], "\n\n".join(report.findings)
    assert report.cases == 6


def test_collectives_with_mismatched_arguments():
    (report,) = fuzz.run_isolated({"collectives (2 ranks)": 25}, timeout=600)
    assert report.findings == [], "\n\n".join(report.findings)
    assert report.cases >= 22


@pytest.mark.parametrize(
    ("target", "what"),
    [("self-test: abort", "crashed (exit -6)"), ("self-test: hang", "hung (killed after 12 s)"),
     ("self-test: finding", "Finding: ")],
)  # fmt: skip
def test_harness_reports_crashes_hangs_and_findings(target, what, monkeypatch):
    """The harness itself: a target that aborts, hangs or finds something on purpose (from
    its 6th-smallest case on) is reported as such, with the case."""
    monkeypatch.setenv("TORCHNEURON_FUZZ_SELFTEST", "1")  # the child imports no torch
    (report,) = fuzz.run_isolated({target: 50}, timeout=12)
    assert len(report.findings) == 1 and what in report.findings[0], report
