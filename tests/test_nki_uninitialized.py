"""Memory a kernel never wrote: undefined on the chip, so in the interpreter, as in AWS's
simulator, new tiles and tensors hold NaN (floats) or 4 (integers) and a kernel that computes
on them shows it; and nc_matmul's accumulate=None (NKI's default), which overwrites a PSUM
location at its first write and accumulates after, so that correct kernels need no zero fill.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl

RNG = np.random.default_rng(5)


@pytest.mark.parametrize("device", ["numpy", "neuron"])
def test_reading_a_tile_never_written_gives_nan_and_4(device) -> None:
    @nki.jit
    def forgets_to_initialise(x):
        floats = nl.ndarray((128, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        ints = nl.ndarray((128, 8), dtype=nl.int32, buffer=nl.shared_hbm)
        acc = nl.ndarray((128, 8), dtype=nl.float32)  # meant to be nl.zeros
        nl.store(floats, value=nl.add(acc, nl.load(x)))
        nl.store(ints, value=nl.ndarray((128, 8), dtype=nl.int32))
        return floats, ints

    x = RNG.standard_normal((128, 8), dtype=np.float32)
    arg = x if device == "numpy" else torch.from_numpy(x).to("neuron")
    for floats, ints in (nki.simulate(forgets_to_initialise)(arg), forgets_to_initialise(arg)):
        assert np.isnan(np.asarray(floats.cpu() if device == "neuron" else floats)).all()
        np.testing.assert_array_equal(np.asarray(ints.cpu() if device == "neuron" else ints), 4)


def test_a_masked_write_leaves_the_rest_of_a_fresh_tile_undefined() -> None:
    @nki.jit
    def sums_a_partly_loaded_tile(x):
        out = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        tile = nl.ndarray((128, 64), dtype=nl.float32)
        i_f = nl.arange(64)[None, :]
        nisa.dma_copy(dst=tile, src=x, mask=i_f < 40)  # columns 40.. are never written
        nl.store(out, value=nl.sum(tile, axis=1, keepdims=True))
        return out

    assert np.isnan(sums_a_partly_loaded_tile.interpret(RNG.random((128, 64), np.float32))).all()


def _k_loop(accumulate):  # noqa: ANN001, ANN202
    @nki.jit
    def matmul(a_t, b):
        k_tiles = a_t.shape[0] // 128
        out = nl.ndarray((128, b.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
        psum = nl.ndarray((128, b.shape[1]), dtype=nl.float32, buffer=nl.psum)  # not zeroed
        for k in nl.affine_range(k_tiles):
            rows = slice(k * 128, (k + 1) * 128)
            nisa.nc_matmul(
                dst=psum, stationary=nl.load(a_t[rows, :]), moving=nl.load(b[rows, :]),
                accumulate=accumulate(k),
            )  # fmt: skip
        nl.store(out, value=nl.copy(psum))
        return out

    return matmul


@pytest.mark.parametrize(
    "name,accumulate",
    [("None (NKI's default)", lambda k: None), ("k > 0", lambda k: k > 0)],
)
def test_matmuls_into_fresh_psum_overwrite_first_then_accumulate(name, accumulate) -> None:
    a_t = RNG.standard_normal((384, 128), dtype=np.float32)
    b = RNG.standard_normal((384, 256), dtype=np.float32)
    kernel = _k_loop(accumulate)
    interpreted = kernel.interpret(a_t, b)
    kernel(a_t, b)
    compiled = kernel(a_t, b)
    for got in (interpreted, compiled):
        np.testing.assert_allclose(got, a_t.T @ b, rtol=1e-5, atol=1e-4, err_msg=name)


def test_accumulating_onto_psum_never_written_is_undefined() -> None:
    """accumulate=True is valid only after a write has initialised the location (NKI's
    documentation): onto a fresh PSUM tile it adds to undefined contents."""
    a_t = RNG.standard_normal((128, 128), dtype=np.float32)
    b = RNG.standard_normal((128, 64), dtype=np.float32)
    assert np.isnan(_k_loop(lambda k: True).interpret(a_t, b)).all()


def test_legacy_plus_equals_into_fresh_psum_starts_the_accumulation() -> None:
    """AWS's allocated rmsnorm-qkv kernel accumulates ``res_psum[0] += nisa.nc_matmul(...)``
    into a PSUM tile from nl.ndarray: the first matmul of each location overwrites it."""

    @nki.jit
    def matmul(a_t, b):
        out = nl.ndarray((128, b.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray((1, nl.par_dim(128), b.shape[1]), dtype=nl.float32, buffer=nl.psum)
        for k in nl.affine_range(a_t.shape[0] // 128):
            rows = slice(k * 128, (k + 1) * 128)
            acc[0] += nisa.nc_matmul(nl.load(a_t[rows, :]), nl.load(b[rows, :]))
        nl.store(out, value=nl.copy(acc[0]))
        return out

    a_t = RNG.standard_normal((256, 128), dtype=np.float32)
    b = RNG.standard_normal((256, 64), dtype=np.float32)
    interpreted = matmul.interpret(a_t, b)
    matmul(a_t, b)
    for got in (interpreted, matmul(a_t, b)):
        np.testing.assert_allclose(got, a_t.T @ b, rtol=1e-5, atol=1e-4)

    @nki.jit
    def adds_to_undefined_sbuf(x):
        out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray(x.shape, dtype=nl.float32)  # SBUF: '+=' is an add, nothing starts
        acc += nl.load(x)
        nl.store(out, value=acc)
        return out

    assert np.isnan(adds_to_undefined_sbuf.interpret(b[:128].copy())).all()
