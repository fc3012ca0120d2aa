"""Sample-style NKI kernels (tests/nki_sample_kernels.py) against numpy references, on the
interpreter and the compiled path; the compiled path must equal the interpreter exactly."""

from __future__ import annotations

import nki_sample_kernels as k
import numpy as np
import pytest

RNG = np.random.default_rng(1234)


def _f32(*shape):
    return RNG.standard_normal(shape, dtype=np.float32)


X_ROWS = _f32(300, 256)  # 300 rows: the last row tile is masked
X_WIDE = _f32(256, 1000)  # 1000 columns: bn_stats in chunks of 512 + 488
W256 = _f32(256)
G1000, B1000 = _f32(1000), _f32(1000)
LHS_T, RHS = _f32(256, 256), _f32(256, 1024)
Q, KEYS, VALUES = _f32(256, 64), _f32(1024, 64), _f32(1024, 64)

# (name, kernel launch, args, reference, absolute tolerance)
CASES = [
    ("tensor_add", k.add_kernel[2, 2], (_f32(256, 1024), _f32(256, 1024)), lambda a, b: a + b, 0.0),
    ("rmsnorm_legacy", k.rmsnorm_kernel, (X_ROWS, W256, 1e-6), k.rmsnorm_ref, 1e-5),
    ("rmsnorm_new", k.rmsnorm_new_kernel, (X_ROWS[:256], W256, 1e-6), k.rmsnorm_ref, 1e-5),
    ("layernorm_new", k.layernorm_kernel, (X_WIDE, G1000, B1000, 1e-5), k.layernorm_ref, 1e-4),
    ("softmax_legacy", k.softmax_kernel, (X_WIDE,), k.softmax_ref, 1e-6),
    ("transpose2d_legacy", k.transpose2d_kernel, (_f32(5, 12), 3, 4), k.transpose2d_ref, 0.0),
    ("avgpool_legacy", k.avgpool_kernel, (_f32(130, 8, 12), 2), k.avgpool_ref, 1e-6),
    ("matmul_new", k.matmul_new_kernel, (LHS_T, RHS), lambda a, b: a.T @ b, 1e-3),
    ("matmul_legacy", k.matmul_legacy_kernel, (LHS_T, RHS), lambda a, b: a.T @ b, 1e-3),
    (
        "flash_attention",
        k.flash_attention_kernel,
        (Q.T.copy(), KEYS.T.copy(), VALUES, 0.125),
        lambda qt, kt, v, s: k.attention_ref(qt.T, kt.T, v, s),
        1e-4,
    ),
]


@pytest.mark.parametrize("name,kernel,args,reference,atol", CASES, ids=[c[0] for c in CASES])
def test_kernel_matches_reference_and_compiled_equals_interpreter(
    name, kernel, args, reference, atol
):
    expected = reference(*args)
    interpreted = kernel.interpret(*args)
    np.testing.assert_allclose(interpreted, expected, rtol=1e-5, atol=atol)
    first = kernel(*args)  # traces (the interpreter) and compiles
    second = kernel(*args)  # runs the compiled code
    assert len(kernel._cache) >= 1
    np.testing.assert_array_equal(first, interpreted)
    np.testing.assert_array_equal(second, interpreted)


def test_compiled_path_is_cached_per_signature():
    kernel = k.softmax_kernel
    kernel._cache.clear()
    kernel(_f32(128, 64))
    kernel(_f32(128, 64))
    assert len(kernel._cache) == 1
    kernel(_f32(256, 64))
    assert len(kernel._cache) == 2


def test_compiled_kernel_reuses_scratch_between_tile_lifetimes():
    kernel = k.matmul_new_kernel
    kernel(LHS_T, RHS)
    entry = next(iter(kernel._cache.values()))
    # 2x2 output tiles x 2 k-steps allocate 20 on-chip tiles; live at once: a few.
    assert entry.program.slots <= 6, entry.program.source


def test_psum_accumulates_in_float32_from_bfloat16_storage():
    import torch

    a = torch.randn(128, 128, dtype=torch.bfloat16)
    b = torch.randn(128, 512, dtype=torch.bfloat16)
    got = k.matmul_new_kernel(a, b)
    assert got.dtype == torch.bfloat16
    expected = (a.float().T @ b.float()).to(torch.bfloat16)
    torch.testing.assert_close(got, expected, rtol=1.6e-2, atol=1e-2)
