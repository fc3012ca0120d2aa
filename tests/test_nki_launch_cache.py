"""The compiled path's fast launch (launch.py ``Kernel._run_fast``): a call whose arguments are
numpy arrays and plain scalars of a signature already compiled skips the argument wrappers.
It must pick the same program the full path would: per shapes, strides, dtypes, scalar
values and the settings a program depends on, checked against the interpreter."""

from __future__ import annotations

import ml_dtypes
import numpy as np

import torchneuron.nki as nki
import torchneuron.nki.language as nl

RNG = np.random.default_rng(4)


@nki.jit
def scale_shift(x, scale, shift):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.add(nl.multiply(nl.load(x), scale), shift))
    return out


def test_a_repeated_signature_takes_the_fast_launch_with_each_calls_values() -> None:
    x = RNG.standard_normal((128, 64)).astype(np.float32)
    for scale, shift in ((2.0, 1.0), (2.0, 1.0), (3.0, 1.0), (3.0, 1), (3.0, 1.0), (3.0, 1)):
        data = x + RNG.standard_normal(x.shape).astype(np.float32)
        got = scale_shift(data, scale, shift)
        np.testing.assert_allclose(got, data * scale + shift, rtol=1e-6)
        np.testing.assert_array_equal(got, scale_shift.interpret(data, scale, shift))
    # three programs (2.0/1.0, 3.0/1.0, 3.0/int 1), each reached by the fast launch from its
    # second call
    assert len(scale_shift._cache) == 3 and len(scale_shift._fast) == 3


def test_the_fast_launch_follows_layout_and_settings(monkeypatch) -> None:
    base = RNG.standard_normal((64, 256)).astype(np.float32)
    strided = base[:, ::2]  # the same shape as a (64, 128) array, other strides
    dense = np.ascontiguousarray(strided)
    for _ in range(2):
        np.testing.assert_array_equal(scale_shift(strided, 2.0, 0.5), strided * 2.0 + 0.5)
        np.testing.assert_array_equal(scale_shift(dense, 2.0, 0.5), dense * 2.0 + 0.5)
    programs = len(scale_shift._cache)
    monkeypatch.setenv("TORCHNEURON_NKI_ROW_PROGRAMS", "never")
    for _ in range(2):
        np.testing.assert_array_equal(scale_shift(dense, 2.0, 0.5), dense * 2.0 + 0.5)
    assert len(scale_shift._cache) == programs + 1  # a program of the numpy kind, apart


def test_bfloat16_arrays_take_the_full_launch() -> None:
    x = RNG.standard_normal((128, 32)).astype(ml_dtypes.bfloat16)
    fresh = nki.jit(scale_shift.fn)
    for _ in range(3):
        got = fresh(x, 2.0, 0.0)
        assert got.dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(got.astype(np.float32), x.astype(np.float32) * 2.0)
    assert len(fresh._fast) == 0 and len(fresh._cache) == 1
