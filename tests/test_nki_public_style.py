"""Public-tutorial-style kernels (tests/support/nki_public_style_kernels.py) run unchanged but for
their import: the module imports neuronxcc.nki / nki, resolved by install_aliases()."""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest

import torchneuron.nki as tnki

RNG = np.random.default_rng(7)


def _is_alias(name: str) -> bool:
    return name in ("nki", "neuronxcc") or name.startswith(("nki.", "neuronxcc."))


@pytest.fixture(scope="module")
def kernels():
    # Earlier tests (the Hub kernel package) may have installed the aliases already: start
    # from none, so this checks that install_aliases() itself provides them.
    earlier = {name: sys.modules.pop(name) for name in list(sys.modules) if _is_alias(name)}
    before = set(sys.modules)
    installed = tnki.install_aliases()
    assert {"neuronxcc", "neuronxcc.nki", "nki"} <= set(installed)
    try:
        yield importlib.import_module("support.nki_public_style_kernels")
    finally:
        for name in set(sys.modules) - before:
            del sys.modules[name]
        sys.modules.update(earlier)


def _both(kernel, *args):
    """The kernel through the interpreter and twice through the compiled path."""
    interpreted = kernel.interpret(*args)
    kernel(*args)
    return interpreted, kernel(*args)


def test_aliases_resolve_to_this_package(kernels):
    import neuronxcc.nki.language as legacy_nl
    import nki.isa as new_isa

    assert legacy_nl is tnki.language and new_isa is tnki.isa


def test_tensor_add_spmd(kernels):
    a = RNG.standard_normal((256, 1024), dtype=np.float32)
    b = RNG.standard_normal((256, 1024), dtype=np.float32)
    got = kernels.tensor_add(a, b)
    np.testing.assert_array_equal(got, a + b)


def test_tensor_add_float16(kernels):
    a = RNG.random((128, 512)).astype(np.float16)
    b = RNG.random((128, 512)).astype(np.float16)
    got = kernels.tensor_add(a, b)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, a + b)  # one float16 rounding of an exact f32 sum


def test_rmsnorm_masked_rows_and_tile_broadcast_to(kernels):
    a = RNG.standard_normal((300, 256), dtype=np.float32)
    g = RNG.standard_normal(256, dtype=np.float32)
    interpreted, compiled = _both(kernels.rmsnorm_kernel_, a, g)
    expected = a / np.sqrt((a * a).mean(-1, keepdims=True)) * g
    np.testing.assert_allclose(interpreted, expected, rtol=1e-5, atol=1e-5)
    # its batched rows run as a C++ row program: sums reassociated, within float32 rounding
    np.testing.assert_allclose(compiled, interpreted, rtol=1e-6, atol=1e-6)


def test_transpose2d_int8(kernels):
    a = np.arange(5 * 3 * 4, dtype=np.int8).reshape(5, 12)
    got = kernels.transpose2d_kernel_(a, (3, 4))
    np.testing.assert_array_equal(got, a.reshape(5, 3, 4).transpose(0, 2, 1).reshape(5, 12))


def test_avgpool_float16(kernels):
    x = np.arange(2 * 6 * 6, dtype=np.float16).reshape(2, 6, 6)
    got = kernels.avgpool_kernel_(x, 2)
    expected = x.astype(np.float32).reshape(2, 3, 2, 3, 2).mean(axis=(2, 4))
    np.testing.assert_array_equal(got, expected.astype(np.float16))


@pytest.mark.parametrize(
    "name", ["matmul_basic_", "matmul_tiled_", "matmul_hoisted_sbuf_accumulate_"]
)
def test_matmul_tutorial_styles(kernels, name):
    kernel = getattr(kernels, name)
    shape = ((128, 64), (128, 512)) if name == "matmul_basic_" else ((256, 256), (256, 1024))
    lhs_t = RNG.standard_normal(shape[0], dtype=np.float32)
    rhs = RNG.standard_normal(shape[1], dtype=np.float32)
    interpreted, compiled = _both(kernel, lhs_t, rhs)
    np.testing.assert_allclose(interpreted, lhs_t.T @ rhs, rtol=1e-4, atol=1e-3)
    # matmul_tiled_'s K chains are fused into one matmul each (reassociated sum: tolerance)
    np.testing.assert_allclose(compiled, interpreted, rtol=1e-5, atol=1e-4)
