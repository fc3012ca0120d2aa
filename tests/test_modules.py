"""The fast subset of the ModuleInfo conformance harness (devtools/module_coverage.py).

One test per module of ``FAST_MODULES``: every sample of the module's ModuleInfo runs on
neuron and on the CPU in train and eval mode (forward, backward with input and parameter
gradients, and eval under no_grad), in each listed dtype, and must match within
``torch.testing.assert_close``'s default tolerance for the dtype (or the ModuleInfo's own).
The full sweep over all of module_db is ``python -m devtools.module_coverage --full``
(report: docs/module_coverage.md).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from devtools import module_coverage as mc
from devtools import module_coverage_db as db
from devtools.conformance import CLOSE, COUNTED, CPU_ERROR, ERROR, EXACT, FAIL, PASS

FAST_MODULES = list(db.FAST_MODULES)


@pytest.fixture(scope="module")
def module_infos():
    return db.modules_by_name()


@pytest.mark.parametrize("name", FAST_MODULES)
def test_module_matches_cpu(name, module_infos):
    assert name in module_infos, f"{name} is not a ModuleInfo of module_db"
    units = mc.units_for(module_infos[name], db.FAST_MODULES[name])
    results = [r for unit in units for r in mc.check_module(unit.op, unit.dtype, unit.mode)]
    counted = [r for r in results if r.status in COUNTED]
    assert {r.mode for r in counted} == set(db.MODES), f"{name}: a mode ran no sample"
    bad = [r.line() for r in counted if r.status != PASS]
    assert not bad, f"{len(bad)} of {len(counted)} samples differ from the CPU:\n" + "\n".join(bad)


def test_subset_covers_modes_dtypes_and_kinds():
    units = mc.select_units(False, None, None)
    assert {u.mode for u in units} == set(db.MODES)
    assert {u.dtype for u in units} == set(db.DTYPES)
    assert len(FAST_MODULES) >= 25
    for kind in ("Conv", "Norm", "Pool", "Loss", "Attention", "Transformer", "Embedding"):
        assert any(kind in name for name in FAST_MODULES), kind


def test_harness_detects_a_wrong_result(module_infos, monkeypatch):
    """The comparison is not vacuous: a module whose neuron output, input gradient,
    parameter gradient or buffer differs from the CPU's, or whose output stays on the CPU,
    fails; an exception on neuron only is an error, one on both is not counted."""

    def on_neuron(x):
        return x.device.type == "neuron"

    class Exact(torch.nn.Linear):
        pass

    class OffByOne(torch.nn.Linear):
        def forward(self, input):
            return super().forward(input) + (1 if on_neuron(input) else 0)

    class OnCpu(torch.nn.Linear):
        def forward(self, input):
            return super().forward(input).cpu()

    class NoWeightGrad(torch.nn.Linear):  # same output, no gradient for the weight on neuron
        def forward(self, input):
            weight = self.weight.detach() if on_neuron(input) else self.weight
            return F.linear(input, weight, self.bias)

    class NoInputGrad(torch.nn.Linear):  # same output, no gradient for the input on neuron
        def forward(self, input):
            return super().forward(input.detach() if on_neuron(input) else input)

    class Raises(torch.nn.Linear):
        def forward(self, input):
            if on_neuron(input):
                raise RuntimeError("boom")
            return super().forward(input)

    class RaisesEverywhere(torch.nn.Linear):
        def forward(self, input):
            raise RuntimeError("no kernel here either")

    info = module_infos["nn.Linear"]
    sample = mc.generate_samples(info, "float32", training=True)[0]  # passes ``input=``

    def check(cls, mode):
        monkeypatch.setattr(info, "module_cls", cls)
        return mc.run_sample(info, sample, "float32", mode, 0)

    for mode in db.MODES:
        passed = check(Exact, mode)
        # within the CPU's tolerance, not bitwise: the native GEMM (csrc/kernels/gemm*) sums
        # a Linear's products in its own order (bitwise with TORCHNEURON_NATIVE_KERNELS=0)
        assert passed.status == PASS and passed.checked in (EXACT, CLOSE), passed.line()
    off = check(OffByOne, db.TRAIN_FORWARD)
    assert off.status == FAIL and off.reason.startswith("output: ") and "not close" in off.reason
    assert check(OffByOne, db.EVAL_NO_GRAD).status == FAIL
    on_cpu = check(OnCpu, db.EVAL_FORWARD)
    assert on_cpu.status == FAIL and "expected a neuron tensor" in on_cpu.reason
    no_weight_grad = check(NoWeightGrad, db.TRAIN_BACKWARD)
    assert no_weight_grad.status == FAIL and "grad['weight']" in no_weight_grad.reason
    assert check(NoWeightGrad, db.TRAIN_FORWARD).status == PASS  # forward alone is right
    no_input_grad = check(NoInputGrad, db.EVAL_BACKWARD)
    assert no_input_grad.status == FAIL and "grad['input 0']" in no_input_grad.reason
    error = check(Raises, db.TRAIN_FORWARD)
    assert error.status == ERROR and "boom" in error.reason
    assert check(Raises, db.TRAIN_BACKWARD).status == ERROR
    assert check(RaisesEverywhere, db.TRAIN_FORWARD).status == CPU_ERROR


def test_harness_compares_buffers(module_infos, monkeypatch):
    """Running statistics are compared after the forward: a BatchNorm that does not update
    them on neuron fails although its training-mode output is right."""

    class FrozenStatsOnNeuron(torch.nn.BatchNorm1d):
        def forward(self, x):
            if x.device.type != "neuron":
                return super().forward(x)
            return F.batch_norm(x, None, None, self.weight, self.bias, True, 0.0, self.eps)

    info = module_infos["nn.BatchNorm1d"]
    sample = mc.generate_samples(info, "float32", training=True)[0]
    assert mc.run_sample(info, sample, "float32", db.TRAIN_FORWARD, 0).status == PASS
    monkeypatch.setattr(info, "module_cls", FrozenStatsOnNeuron)
    frozen = mc.run_sample(info, sample, "float32", db.TRAIN_FORWARD, 0)
    assert frozen.status == FAIL and frozen.reason.startswith("buffers['running_"), frozen.line()
