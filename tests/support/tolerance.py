"""How a model's output on neuron is compared with the same model's output on the CPU.

With ``TORCHNEURON_NATIVE_KERNELS=0`` the device runs PyTorch's CPU kernels, so outputs equal
the CPU's bit for bit and the comparison is exact (``native_kernels_enabled()`` is false).

With the native kernels (the default), float32 results differ by rounding. Each kernel's
bound is relative and per element: exp within about 1 ulp (csrc/kernels/vec_exp.h), so
softmax and SiLU within a few ulps of the correctly rounded value; sums and dot products
accumulate n terms in another order (GEMM, softmax's denominator), within n·u·Σ|terms|. The
vector width of the instruction set in use (scalar, AVX2, AVX-512) sets that order, so the
rounding differs between hosts. A model composes many such kernels; its output carries their
error amplified by the model's conditioning, and an element-wise absolute tolerance is the
wrong measure of that (one element near a cancellation can hold most of it, and which one
depends on the host). So outputs compare normwise:

    ||actual - expected||_2 <= budget * u * ||expected||_2,   u = 2**-24 (float32 rounding)

with a budget in units of rounding stated by each caller: the kernels' per-element bound
(a few units) times the amplification the caller's model is allowed (its depth, stated
where it is used). Measured on AVX2 and scalar levels, the Diffusers pipelines of
tests/test_diffusers.py sit at 1-4 units normwise while their largest element error reaches
13 units; an AVX-512 host exceeded an element-wise 1e-6 (17 units at 1.0).
"""

from __future__ import annotations

import torch

FLOAT32_UNIT_ROUNDOFF = 2.0**-24


def native_kernels_enabled() -> bool:
    import torchneuron

    return bool(torchneuron._C._native_kernels_enabled())


def assert_normwise_close(actual: torch.Tensor, expected: torch.Tensor, budget: float) -> None:
    """||actual - expected|| <= budget * u * ||expected|| (see the module docstring), after
    checking shape, dtype and that every element is finite where expected's is."""
    actual = actual.detach().cpu()
    expected = expected.detach().cpu()
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert torch.equal(torch.isfinite(actual), torch.isfinite(expected)), "non-finite elements"
    finite = torch.isfinite(expected)
    diff = (actual[finite].double() - expected[finite].double()).norm().item()
    scale = expected[finite].double().norm().item()
    units = (
        diff / (FLOAT32_UNIT_ROUNDOFF * scale) if scale else (0.0 if diff == 0 else float("inf"))
    )
    worst = (actual[finite] - expected[finite]).abs().max().item() if finite.any() else 0.0
    assert units <= budget, (
        f"normwise error {units:.1f} units of rounding (budget {budget}); "
        f"largest element error {worst:.3g}"
    )


def assert_matches_cpu(actual: torch.Tensor, expected: torch.Tensor, budget: float) -> None:
    """Bitwise without the native kernels; within `budget` units normwise with them."""
    if native_kernels_enabled():
        assert_normwise_close(actual, expected, budget)
    else:
        torch.testing.assert_close(actual.cpu(), expected.cpu(), rtol=0, atol=0)
