"""``tensor.view(dtype)`` on HBM tensors, float8 host arrays, and nc_matmul's FP8
``perf_mode="double_row"`` (NeuronCore-v3+), against numpy: numpy's own ``ndarray.view`` of
the same bytes, and the einsum over both contraction dimensions that AWS's Trainium2
architecture guide describes. Each kernel runs in the interpreter and the compiled path
(twice: the recording and its replay). aws-neuron-sdk's
nki/test/test_nki_isa_nc_matmul.py::test_double_row_gen3, which uses all three, passes
unchanged under ``python -m torchneuron.nki.samples`` (docs/nki.md)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki import NkiError, NkiUnsupportedError

RNG = np.random.default_rng(11)


def _runs(kernel):
    return (kernel.interpret, kernel, kernel)


@pytest.mark.parametrize(
    ("source", "target"),
    [
        (np.float32, np.int32),  # same size: the shape stays
        (np.float32, ml_dtypes.bfloat16),  # 4 -> 2 bytes: the last dimension doubles
        (np.float32, np.uint8),
        (np.int16, np.float16),
        (ml_dtypes.bfloat16, np.uint16),
        (ml_dtypes.float8_e4m3fn, np.int8),
        (np.uint8, ml_dtypes.float8_e5m2),
        (np.int8, np.uint8),
    ],
)
def test_a_dtype_view_reads_the_bytes_as_numpy_does(source, target) -> None:
    values = RNG.standard_normal((128, 32)).astype(np.float32) * 8
    if np.dtype(source).kind in "iu":
        values = RNG.integers(0, 120, (128, 32))
    x = values.astype(source)
    expected = x.view(target)

    @nki.jit
    def kernel(x):
        view = x.view(target)
        out = nl.ndarray(view.shape, dtype=view.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(view))
        return out

    nan = np.isnan(expected.astype(np.float32)) if expected.dtype.kind != "i" else False
    size = expected.dtype.itemsize
    for run in _runs(kernel):
        got = np.asarray(run(x))
        assert got.shape == expected.shape and got.dtype == expected.dtype
        # bytes equal (signed zeros, subnormals count) but for NaN payloads: the simulator
        # holds bfloat16/float8 as float32 values, whose conversion makes NaNs canonical
        same = got.view(np.uint8).reshape(*got.shape, size) == expected.view(np.uint8).reshape(
            *got.shape, size
        )
        assert np.all(same.all(-1) | nan)
        assert np.array_equal(np.isnan(got.astype(np.float32)), nan | np.zeros(got.shape, bool))


def test_a_view_of_the_same_dtype_is_the_tensor_itself_and_writable() -> None:
    x = RNG.standard_normal((128, 16)).astype(np.float32)

    @nki.jit
    def kernel(x):
        same = x.view(nl.float32)
        nl.store(same, value=nl.multiply(nl.load(same), 2.0))
        return x

    for run in (kernel.interpret, kernel):
        y = x.copy()
        run(y)
        assert np.array_equal(y, x * 2)


def test_writing_through_a_view_of_another_dtype_is_refused() -> None:
    @nki.jit
    def kernel(x):
        view = x.view(nl.int32)
        nl.store(view, value=nl.load(view))
        return x

    with pytest.raises(NkiError, match=r"tensor.view\(int32\) of a float32 tensor is read-only"):
        kernel.interpret(np.zeros((128, 8), np.float32))


@pytest.mark.parametrize(
    ("shape", "dtype", "message"),
    [
        ((128, 3), np.uint8, "3 bytes do not divide into 2-byte"),
    ],
)
def test_a_view_whose_bytes_do_not_divide_is_refused(shape, dtype, message) -> None:
    @nki.jit
    def kernel(x):
        view = x.view(nl.float16)
        out = nl.ndarray(view.shape, dtype=view.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(view))
        return out

    with pytest.raises(NkiError, match=message):
        kernel.interpret(np.zeros(shape, dtype))


def test_a_dtype_view_of_an_on_chip_tile_is_refused() -> None:
    @nki.jit
    def kernel(x):
        tile = nl.load(x)
        _ = tile.view(nl.int32)
        return x

    with pytest.raises(NkiUnsupportedError, match="on-chip tile"):
        kernel.interpret(np.zeros((128, 8), np.float32))


@pytest.mark.parametrize("fp8", [ml_dtypes.float8_e5m2, ml_dtypes.float8_e4m3fn])
def test_float8_host_arrays_go_in_and_come_out_exactly(fp8) -> None:
    x = (RNG.standard_normal((128, 64)) * 4).astype(fp8)

    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(x))
        return out

    for run in _runs(kernel):
        got = run(x)
        assert got.dtype == np.dtype(fp8)
        assert np.array_equal(got.view(np.uint8), x.view(np.uint8))


def _double_row_kernel(perf_mode, accumulate_twice=False):
    @nki.jit
    def kernel(a, b):
        k, _, m = a.shape
        n = b.shape[2]
        out = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.shared_hbm)
        stationary = nl.load(a)
        moving = nl.load(b)
        acc = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.psum)
        nisa.nc_matmul(acc, stationary, moving, perf_mode=perf_mode)
        if accumulate_twice:
            nisa.nc_matmul(acc, stationary, moving, perf_mode=perf_mode, accumulate=True)
        result = nl.ndarray((m, n), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_copy(result, acc)
        nl.store(out, value=result)
        return out

    return kernel


@pytest.mark.parametrize(
    ("k", "m", "n", "perf_mode"),
    [
        (128, 128, 512, nisa.matmul_perf_mode.double_row),
        (64, 16, 100, "double_row"),
        (128, 1, 512, "double_row_gen3"),  # the spelling of aws-neuron-sdk's test
    ],
)
def test_double_row_contracts_both_dimensions(k, m, n, perf_mode) -> None:
    a = (RNG.standard_normal((k, 2, m)) * 2).astype(ml_dtypes.float8_e4m3fn)
    b = (RNG.standard_normal((k, 2, n)) * 2).astype(ml_dtypes.float8_e5m2)
    expected = np.einsum("kli,klj->ij", a.astype(np.float64), b.astype(np.float64))
    kernel = _double_row_kernel(perf_mode)
    for run in _runs(kernel):
        np.testing.assert_allclose(run(a, b), expected, rtol=1e-6, atol=1e-4)
    twice = _double_row_kernel(perf_mode, accumulate_twice=True)
    np.testing.assert_allclose(twice(a, b), 2 * expected, rtol=1e-6, atol=1e-4)


def test_double_row_costs_the_cycles_of_one_k_row_product() -> None:
    a = np.ones((128, 2, 128), ml_dtypes.float8_e4m3fn)
    b = np.ones((128, 2, 512), ml_dtypes.float8_e4m3fn)
    cost = nki.estimate(_double_row_kernel("double_row"), a, b)
    assert cost.matmul_flops == 2 * 256 * 128 * 512
    assert cost.instructions["tensor"] == 1


@pytest.mark.parametrize(
    ("a_shape", "b_shape", "dtype", "target", "message"),
    [
        ((128, 2, 64), (128, 2, 64), ml_dtypes.float8_e4m3fn, "trn1", "NeuronCore-v3 or newer"),
        ((128, 2, 64), (128, 2, 64), ml_dtypes.bfloat16, "trn2", "takes float8 operands"),
        ((128, 3, 64), (128, 3, 64), ml_dtypes.float8_e4m3fn, "trn2", r"must be \[K, 2, free\]"),
        ((128, 64), (128, 64), ml_dtypes.float8_e4m3fn, "trn2", r"must be \[K, 2, free\]"),
        ((128, 2, 64), (64, 2, 64), ml_dtypes.float8_e4m3fn, "trn3", "need one K"),
        ((128, 2, 64), (128, 2, 640), ml_dtypes.float8_e4m3fn, "trn2", "at most 512"),
    ],
)
def test_double_row_rules(a_shape, b_shape, dtype, target, message, monkeypatch) -> None:
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", target)
    a, b = np.zeros(a_shape, dtype), np.zeros(b_shape, dtype)

    @nki.jit
    def kernel(a, b):
        out = nl.ndarray((a.shape[-1], b.shape[-1]), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, value=nisa.nc_matmul(nl.load(a), nl.load(b), perf_mode="double_row"))
        return out

    with pytest.raises(NkiError, match=message):
        kernel.interpret(a, b)


def test_double_row_refuses_transpose_mode_and_an_unknown_mode() -> None:
    a = np.zeros((128, 2, 64), ml_dtypes.float8_e4m3fn)

    @nki.jit
    def transpose(a):
        out = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.psum)
        tile = nl.load(a)
        nisa.nc_matmul(acc, tile, tile, is_transpose=True, perf_mode="double_row")
        nl.store(out, value=nl.copy(acc))
        return out

    @nki.jit
    def unknown(a):
        out = nl.ndarray((64, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        tile = nl.load(a)
        nl.store(out, value=nisa.nc_matmul(tile, tile, perf_mode="quad_row"))
        return out

    with pytest.raises(NkiError, match="cannot be combined with transpose mode"):
        transpose.interpret(a)
    with pytest.raises(NkiError, match="'quad_row' is not one of none, double_row"):
        unknown.interpret(a)
