"""The fast subset of the OpInfo conformance harness (devtools/op_coverage.py).

One test per op of ``FAST_OPS``: every sample input of the op's OpInfo runs on neuron and
on the CPU, forward in each listed dtype and backward (input gradients) in float32, and
must match within ``torch.testing.assert_close``'s default tolerance for the dtype (exact
for integers and bool). The full sweep over all of op_db is
``python -m devtools.op_coverage --full`` (report: docs/op_coverage.md).
"""

from __future__ import annotations

import pytest
import torch

from devtools import op_coverage

FAST_OPS = list(op_coverage.FAST_OPS)


@pytest.fixture(scope="module")
def opinfos():
    return op_coverage.ops_by_key()


@pytest.mark.parametrize("key", FAST_OPS)
def test_op_matches_cpu(key, opinfos):
    assert key in opinfos, f"{key} is not an OpInfo of op_db"
    opinfo = opinfos[key]
    units = op_coverage.units_for(opinfo, op_coverage.FAST_OPS[key])
    assert units, f"{key}: none of {op_coverage.FAST_OPS[key]} is supported on the CPU"
    results = []
    for unit in units:
        results += op_coverage.check_op(unit.op, unit.dtype, unit.mode)
    counted = [r for r in results if r.status in op_coverage.COUNTED]
    assert counted, f"{key}: no sample ran on the CPU"
    bad = [r.line() for r in counted if r.status != op_coverage.PASS]
    assert not bad, f"{len(bad)} of {len(counted)} samples differ from the CPU:\n" + "\n".join(bad)


def test_subset_covers_forward_and_backward(opinfos):
    units = op_coverage.select_units(False, None, None)
    modes = {u.mode for u in units}
    dtypes = {u.dtype for u in units}
    assert modes == {op_coverage.FORWARD, op_coverage.BACKWARD}
    assert dtypes == set(op_coverage.DTYPES)
    assert len(FAST_OPS) >= 60


def test_harness_detects_a_wrong_result(opinfos, monkeypatch):
    """The comparison is not vacuous: a neuron op that returns a wrong value, a CPU tensor, or
    a copy instead of a view is reported as a failure, and an exception as an error."""
    opinfo = opinfos["neg"]
    sample = op_coverage.generate_samples(opinfo, "float32", op_coverage.FORWARD)[0]

    def check(fn):
        monkeypatch.setattr(opinfo, "op", fn)
        return op_coverage.run_sample(opinfo, sample, "float32", op_coverage.FORWARD, 0)

    assert check(torch.neg).status == op_coverage.PASS
    off_by_one = check(lambda x: torch.neg(x) + (1 if x.device.type == "neuron" else 0))
    assert off_by_one.status == op_coverage.FAIL and "not close" in off_by_one.reason
    on_cpu = check(lambda x: torch.neg(x).cpu())
    assert on_cpu.status == op_coverage.FAIL and "expected a neuron tensor" in on_cpu.reason

    def raises_on_neuron(x):
        if x.device.type == "neuron":
            raise RuntimeError("boom")
        return torch.neg(x)

    error = check(raises_on_neuron)
    assert error.status == op_coverage.ERROR and "boom" in error.reason

    view_opinfo = opinfos["view"]
    view_sample = op_coverage.generate_samples(view_opinfo, "float32", op_coverage.FORWARD)[0]
    monkeypatch.setattr(
        view_opinfo,
        "op",
        lambda x, *a: x.view(*a).clone() if x.device.type == "neuron" else x.view(*a),
    )
    copied = op_coverage.run_sample(view_opinfo, view_sample, "float32", op_coverage.FORWARD, 0)
    assert copied.status == op_coverage.FAIL and "view" in copied.reason
