"""NKI 0.8's ``nki.language`` additions against closed forms and numpy: activation
derivatives and smooth activations, magnitude comparisons (NeuronCore-v4 only), variance,
``all``, ``rms_norm``, ``gather_flattened``, buffer predicates, ``dynamic_range`` with device
bounds, ``no_reorder``, and the random numbers (``random_seed``/``rand``/``dropout``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki import NkiError

RNG = np.random.default_rng(8)


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf)(x.astype(np.float64))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x.astype(np.float64)))


CLOSED_FORMS = {
    "softplus": lambda x: np.log1p(np.exp(x.astype(np.float64))),
    "mish": lambda x: x * np.tanh(np.log1p(np.exp(x.astype(np.float64)))),
    "gelu_apprx_sigmoid": lambda x: x * _sigmoid(1.702 * x),
    "silu_dx": lambda x: _sigmoid(x) * (1 + x * (1 - _sigmoid(x))),
    "erf_dx": lambda x: 2 / math.sqrt(math.pi) * np.exp(-(x.astype(np.float64) ** 2)),
    "gelu_dx": lambda x: (
        0.5 * (1 + _erf(x / math.sqrt(2)))
        + x * np.exp(-0.5 * x.astype(np.float64) ** 2) / math.sqrt(2 * math.pi)
    ),
}


@pytest.mark.parametrize("name", sorted(CLOSED_FORMS))
def test_activations_match_their_closed_forms(name: str) -> None:
    fn = getattr(nl, name)

    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=fn(nl.load(x)))
        return out

    x = RNG.uniform(-6, 6, size=(128, 64)).astype(np.float32)
    for run in (kernel.interpret, kernel, kernel):
        np.testing.assert_allclose(run(x), CLOSED_FORMS[name](x), rtol=2e-5, atol=2e-6)


def test_derivatives_are_the_slopes_of_their_functions() -> None:
    """gelu_dx and gelu_apprx_sigmoid_dx against central differences of gelu and its
    sigmoid approximation (the derivative checked against the function it differentiates)."""

    @nki.jit
    def kernel(x):
        out = nl.ndarray((4,) + x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        tile = nl.load(x)
        for n, fn in enumerate((nl.gelu, nl.gelu_dx, nl.gelu_apprx_sigmoid, None)):
            if fn is not None:
                nl.store(out[n], value=fn(tile))
        nl.store(out[3], value=nl.gelu_apprx_sigmoid_dx(tile))
        return out

    h = 1e-2
    x = np.linspace(-4, 4, 128 * 8, dtype=np.float32).reshape(128, 8)
    values = kernel(x)
    up, down = kernel(x + h), kernel(x - h)
    np.testing.assert_allclose(values[1], (up[0] - down[0]) / (2 * h), atol=2e-4)
    np.testing.assert_allclose(values[3], (up[2] - down[2]) / (2 * h), atol=2e-4)


def test_var_all_rms_norm_and_gather_flattened() -> None:
    @nki.jit
    def kernel(x, w, flags, indices):
        var = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        every = nl.ndarray((128,), dtype=nl.float32, buffer=nl.shared_hbm)
        normed = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        picked = nl.ndarray(indices.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        tile = nl.load(x)
        nl.store(var, value=nl.var(tile, axis=1))
        nl.store(every, value=nl.all(nl.load(flags), axis=1, dtype=nl.float32))
        nl.store(normed, value=nl.rms_norm(tile, nl.load(w), axis=1, n=x.shape[1], epsilon=1e-5))
        nl.store(picked, value=nl.gather_flattened(tile, nl.load(indices)))
        return var, every, normed, picked

    x = RNG.standard_normal((128, 96), dtype=np.float32)
    w = RNG.standard_normal((1, 96), dtype=np.float32)
    flags = (RNG.random((128, 5)) > 0.1).astype(np.float32)
    indices = RNG.integers(0, 96, size=(128, 12)).astype(np.int32)
    for run in (kernel.interpret, kernel, kernel):
        var, every, normed, picked = run(x, w, flags, indices)
        np.testing.assert_allclose(var[:, 0], x.var(axis=1), rtol=1e-5)
        np.testing.assert_array_equal(every, flags.all(axis=1).astype(np.float32))
        rms = np.sqrt(np.square(x.astype(np.float64)).mean(axis=1, keepdims=True) + 1e-5)
        np.testing.assert_allclose(normed, x / rms * w, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(picked, np.take_along_axis(x, indices, axis=1))


def test_abs_max_and_abs_min_are_neuroncore_v4_only(monkeypatch) -> None:
    @nki.jit
    def kernel(a, b):
        out = nl.ndarray((2,) + a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        x, y = nl.load(a), nl.load(b)
        nl.store(out[0], value=nl.abs_max(x, y))
        nl.store(out[1], value=nl.abs_min(x, y))
        return out

    a = RNG.integers(-4, 5, size=(128, 16)).astype(np.float32)  # ties included
    b = RNG.integers(-4, 5, size=(128, 16)).astype(np.float32)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    with pytest.raises(NkiError, match=r"\(trn3\) and newer only; the target is trn2"):
        kernel(a, b)
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3")
    out = kernel(a, b)
    np.testing.assert_array_equal(out[0], np.where(np.abs(a) > np.abs(b), a, b))  # tie: b
    np.testing.assert_array_equal(out[1], np.where(np.abs(a) < np.abs(b), a, b))


def test_buffer_predicates() -> None:
    assert [nl.is_hbm(b) for b in (nl.hbm, nl.shared_hbm, nl.private_hbm, nl.sbuf)] == [
        True, True, True, False,
    ]  # fmt: skip
    assert (nl.is_sbuf(nl.sbuf), nl.is_psum(nl.psum), nl.is_on_chip(nl.psum)) == (True,) * 3
    assert not nl.is_on_chip(nl.shared_hbm)


def test_dynamic_range_runs_to_a_bound_read_on_the_device() -> None:
    @nki.jit
    def kernel(x, count):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nisa.dma_copy(dst=out, src=x)
        bound = nisa.register_alloc()
        nisa.register_load(bound, count)
        row = [[x.shape[1], 1], [1, x.shape[1]]]
        for i in nl.dynamic_range(bound):
            tile = nl.ndarray((1, x.shape[1]), dtype=x.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=tile, src=x.ap(row, scalar_offset=i))
            nisa.dma_copy(dst=out.ap(row, scalar_offset=i), src=nl.multiply(tile, 2.0))
        return out

    x = RNG.standard_normal((6, 8), dtype=np.float32)
    for count in (0, 4, 6):
        expected = x.copy()
        expected[:count] *= 2
        np.testing.assert_array_equal(kernel(x, np.array([[count]], np.int32)), expected)


def test_no_reorder_refuses_register_loops_inside_it() -> None:
    @nki.jit
    def kernel(x):
        with nl.no_reorder():
            nl.load(x)
            nl.fori_loop(0, 2, lambda i: None)
        return x

    with pytest.raises(NkiError, match="not supported inside nl.no_reorder"):
        kernel.interpret(np.zeros((4, 4), np.float32))

    @nki.jit
    def ordered(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        with nl.no_reorder():
            nl.store(out, value=nl.add(nl.load(x), 1.0))
        return out

    np.testing.assert_array_equal(ordered(np.ones((4, 4), np.float32)), np.full((4, 4), 2.0))


def test_random_numbers_repeat_with_their_seed_and_dropout_drops_at_its_rate() -> None:
    @nki.jit
    def kernel(x, seed):
        out = nl.ndarray((3,) + x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        s = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=s, src=seed)
        nl.random_seed(s)
        nl.store(out[0], value=nl.rand(x.shape, dtype=nl.float32))
        nl.random_seed(s)
        nl.store(out[1], value=nl.rand(x.shape, dtype=nl.float32))
        nl.store(out[2], value=nl.dropout(nl.load(x), 0.25))
        return out

    x = RNG.uniform(1, 2, size=(128, 256)).astype(np.float32)
    first = kernel(x, np.array([[42]], np.int32))
    np.testing.assert_array_equal(first[0], first[1])  # same seed, same numbers
    assert 0.0 <= first[0].min() and first[0].max() < 1.0
    assert abs(first[0].mean() - 0.5) < 0.01  # 32768 uniforms: sd of the mean 0.0016
    dropped = first[2] == 0
    assert abs(dropped.mean() - 0.25) < 0.015  # sd 0.0024
    np.testing.assert_array_equal(first[2][~dropped], x[~dropped])  # kept, not rescaled
    again = kernel(x, np.array([[42]], np.int32))
    np.testing.assert_array_equal(again, first)  # the same seed, call after call
    other = kernel(x, np.array([[7]], np.int32))
    assert not np.array_equal(other[0], first[0])
