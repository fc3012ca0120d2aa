"""NKI 0.6-0.8 device scalars and control flow (torchneuron/nki/control_flow.py): registers
loaded from tiles bound nl.fori_loop and nl.while_loop and select nl.if_else's branch.

References are closed forms of each kernel. Every kernel runs interpreted and compiled, and
the compiled path is called again with another device value: a kernel whose control flow
depends on data must not replay the control path of an earlier call.
"""

from __future__ import annotations

import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki import NkiError

ROW = np.arange(8, dtype=np.float32).reshape(1, 8)


def _scalar(value: int) -> np.ndarray:
    return np.array([[value]], dtype=np.int32)


def _register_from(value_hbm):  # noqa: ANN001, ANN202 - kernel helpers take NKI tiles
    staged = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=staged, src=value_hbm)
    reg = nisa.register_alloc()
    nisa.register_load(reg, staged)
    return reg


@nki.jit
def _sum_rows_runtime_count(count, data):
    out = nl.ndarray((1, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.zeros((1, 8), dtype=nl.float32, buffer=nl.sbuf)
    row = nl.ndarray((1, 8), dtype=nl.float32, buffer=nl.sbuf)

    def body(i):
        nisa.dma_copy(dst=row, src=data)
        nisa.tensor_tensor(dst=acc, data1=acc, data2=row, op=nl.add)

    nl.fori_loop(0, _register_from(count), body)
    nisa.dma_copy(dst=out, src=acc)
    return out


@nki.jit
def _sum_of_iteration_values(lower, upper):
    out = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.zeros((1, 1), dtype=nl.float32, buffer=nl.sbuf)
    value = nl.ndarray((1, 1), dtype=nl.float32, buffer=nl.sbuf)

    def body(i):
        nisa.register_store(value, i)  # the iteration's value, as a number in SBUF
        nisa.tensor_tensor(dst=acc, data1=acc, data2=value, op=nl.add)

    nl.fori_loop(_register_from(lower), _register_from(upper), body, step=3)
    nisa.dma_copy(dst=out, src=acc)
    return out


@nki.jit
def _count_down(count, data):
    out = nl.ndarray((1, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.zeros((1, 8), dtype=nl.float32, buffer=nl.sbuf)
    row = nl.ndarray((1, 8), dtype=nl.float32, buffer=nl.sbuf)

    def body(remaining):
        nisa.dma_copy(dst=row, src=data)
        nisa.tensor_tensor(dst=acc, data1=acc, data2=row, op=nl.add)
        return remaining - 1

    nl.while_loop(_register_from(count), body)
    nisa.dma_copy(dst=out, src=acc)
    return out


@nki.jit
def _shift_by_sign(flag, data):
    out = nl.ndarray((1, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    staged = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=staged, src=flag)
    result = nl.ndarray((1, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=result, src=data)

    def then_branch():
        nisa.tensor_scalar(dst=result, data=result, op0=nl.add, operand0=10.0)

    def else_branch():
        nisa.tensor_scalar(dst=result, data=result, op0=nl.subtract, operand0=10.0)

    nl.if_else(nisa.scalar_load(staged) > 0, then_branch, else_branch)
    nisa.dma_copy(dst=out, src=result)
    return out


RUNS = {
    "interpreted": lambda kernel, *args: kernel.interpret(*args),
    "compiled": lambda k, *a: k(*a),
}


@pytest.mark.parametrize("run", RUNS)
def test_fori_loop_bound_read_from_the_device(run: str) -> None:
    for count in (3, 0, 5, 1):  # the compiled path is called again with each count
        got = RUNS[run](_sum_rows_runtime_count, _scalar(count), ROW)
        np.testing.assert_array_equal(got, count * ROW)


@pytest.mark.parametrize("run", RUNS)
def test_fori_loop_passes_each_iteration_value(run: str) -> None:
    for lower, upper in ((2, 17), (5, 6), (9, 3)):
        got = RUNS[run](_sum_of_iteration_values, _scalar(lower), _scalar(upper))
        assert got[0, 0] == sum(range(lower, upper, 3))


@pytest.mark.parametrize("run", RUNS)
def test_while_loop_checks_its_condition_before_each_iteration(run: str) -> None:
    for count in (4, 0, 2):  # zero: the body never runs
        np.testing.assert_array_equal(RUNS[run](_count_down, _scalar(count), ROW), count * ROW)


@pytest.mark.parametrize("run", RUNS)
def test_if_else_takes_the_branch_the_device_value_selects(run: str) -> None:
    for flag, shift in ((1, 10.0), (0, -10.0), (-7, -10.0), (42, 10.0)):
        np.testing.assert_array_equal(RUNS[run](_shift_by_sign, _scalar(flag), ROW), ROW + shift)


def test_python_control_flow_on_a_register_is_refused_with_the_alternatives() -> None:
    @nki.jit
    def branches_in_python(count):
        reg = _register_from(count)
        if reg:  # the value is the device's, unknown while the kernel is traced
            pass

    with pytest.raises(TypeError, match="use nl.fori_loop, nl.while_loop or nl.if_else"):
        branches_in_python(_scalar(1))

    @nki.jit
    def ranges_over_it(count):
        for _ in range(_register_from(count)):
            pass

    with pytest.raises(TypeError, match="not known while the kernel is traced"):
        ranges_over_it(_scalar(2))


def test_bad_operands_name_the_rule() -> None:
    @nki.jit
    def loads_a_block(x):
        tile = nl.load(x)
        nisa.register_load(nisa.register_alloc(), tile)

    with pytest.raises(NkiError, match=r"exactly one element \(\[1\] or \[1, 1\]\), not \(2, 2\)"):
        loads_a_block(np.zeros((2, 2), np.int32))

    @nki.jit
    def zero_step(x):
        nl.fori_loop(0, 4, lambda i: None, step=0)

    with pytest.raises(NkiError, match="step must be a positive Python int, not 0"):
        zero_step(np.zeros((1, 1), np.int32))

    @nki.jit
    def body_returns_nothing(count):
        nl.while_loop(_register_from(count), lambda r: None)

    with pytest.raises(NkiError, match="must return the next condition register, got NoneType"):
        body_returns_nothing(_scalar(1))

    with pytest.raises(NkiError, match="src must be a tensor in HBM or SBUF, not ndarray"):
        nisa.scalar_load(np.zeros((1, 1), np.int32))  # a kernel's tensors, not host arrays
