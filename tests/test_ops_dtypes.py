"""dtype conversions, type promotion, low-precision ops, autocast and factories on neuron,
checked against the CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from support.op_check import BF16, DEVICE, EXACT, FP16, FP32, check

# ---------------------------------------------------------------------------- dtypes


@pytest.mark.parametrize(
    "dtype",
    [
        torch.bfloat16,
        torch.float16,
        torch.float64,
        torch.int64,
        torch.int32,
        torch.int8,
        torch.uint8,
        torch.bool,
    ],
)
def test_to_dtype_matches_cpu(dtype):
    torch.manual_seed(0)
    x = torch.randn(5, 7) * 50
    dev = x.to(DEVICE)
    converted = dev.to(dtype)
    assert converted.dtype == dtype
    assert converted.device == DEVICE
    torch.testing.assert_close(converted.cpu(), x.to(dtype), **EXACT)
    back = converted.to(torch.float32)
    torch.testing.assert_close(back.cpu(), x.to(dtype).to(torch.float32), **EXACT)
    # device and dtype changed in one call, both directions
    torch.testing.assert_close(x.to(DEVICE, dtype).cpu(), x.to(dtype), **EXACT)
    torch.testing.assert_close(dev.to("cpu", dtype), x.to(dtype), **EXACT)


@pytest.mark.parametrize(("dtype", "tol"), [(torch.bfloat16, BF16), (torch.float16, FP16)])
def test_low_precision_ops(dtype, tol):
    torch.manual_seed(0)
    fns = [
        lambda a, b, w: a + b,
        lambda a, b, w: a * b - a,
        lambda a, b, w: a @ b.t(),
        lambda a, b, w: F.linear(a, w),
        lambda a, b, w: F.softmax(a, dim=-1),
        lambda a, b, w: F.layer_norm(a, (8,)),
        lambda a, b, w: F.gelu(a),
        lambda a, b, w: F.silu(b),
        lambda a, b, w: a.sum(1),
        lambda a, b, w: a.mean(),
        lambda a, b, w: a.max(1),
        lambda a, b, w: torch.cat([a, b]),
        lambda a, b, w: F.scaled_dot_product_attention(a[None, None], b[None, None], b[None, None]),
    ]
    inputs = [
        torch.randn(6, 8, dtype=dtype),
        torch.randn(6, 8, dtype=dtype),
        torch.randn(4, 8, dtype=dtype),
    ]
    for fn in fns:
        check(fn, inputs, tol=tol)


def test_float64_ops():
    torch.manual_seed(0)
    inputs = [torch.randn(5, 5, dtype=torch.float64), torch.randn(5, 5, dtype=torch.float64)]
    for fn in (
        torch.matmul,
        lambda a, b: (a.exp() * b).sum(0),
        lambda a, b: torch.linalg.inv(a @ a.T + torch.eye(5, dtype=a.dtype, device=a.device)),
    ):
        check(fn, inputs, tol={"rtol": 1e-12, "atol": 1e-12})


def test_type_promotion_matches_cpu():
    a = torch.arange(6, dtype=torch.int64)
    b = torch.linspace(0, 1, 6)
    c = torch.tensor([True, False, True, True, False, True])
    pairs = [
        (a, b),
        (a, c),
        (b, c),
        (a.to(torch.int8), a.to(torch.uint8)),
        (b.to(torch.bfloat16), b.to(torch.float16)),
    ]
    for x, y in pairs:
        expected = x + y
        got = x.to(DEVICE) + y.to(DEVICE)
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got.cpu(), expected, **EXACT)
    got = torch.arange(3, device=DEVICE) * 1.5
    assert got.dtype == torch.float32


def test_autocast_bf16_policy():
    torch.manual_seed(0)
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    with torch.autocast("neuron", dtype=torch.bfloat16):
        mm = a.to(DEVICE) @ b.to(DEVICE)
        soft = F.softmax(mm, dim=-1)  # run in float32 under autocast
        mixed = mm + torch.ones(8, 4, device=DEVICE)  # promoted to the wider type
    assert mm.dtype == torch.bfloat16
    assert soft.dtype == torch.float32
    assert mixed.dtype == torch.float32
    expected = a.to(torch.bfloat16) @ b.to(torch.bfloat16)
    torch.testing.assert_close(mm.cpu(), expected, **EXACT)
    torch.testing.assert_close(soft.cpu(), F.softmax(expected.float(), -1), **FP32)


# ---------------------------------------------------------------------------- factories


def test_factories_match_cpu():
    pairs = [
        (lambda d: torch.zeros(3, 4, device=d), EXACT),
        (lambda d: torch.ones(2, 3, dtype=torch.int64, device=d), EXACT),
        (lambda d: torch.full((2, 2), 3.5, device=d), EXACT),
        (lambda d: torch.arange(0, 10, 0.5, device=d), EXACT),
        (lambda d: torch.linspace(-1, 1, 11, device=d), FP32),
        (lambda d: torch.logspace(0, 2, 5, device=d), FP32),
        (lambda d: torch.eye(4, 3, device=d), EXACT),
        (lambda d: torch.tensor([[1.0, 2.0], [3.0, 4.0]], device=d), EXACT),
        (lambda d: torch.zeros_like(torch.empty(2, 3, device=d)), EXACT),
        (lambda d: torch.full_like(torch.empty(2, 3, device=d), 7), EXACT),
        (lambda d: torch.tril_indices(4, 4, device=d), EXACT),
        (lambda d: torch.empty(0, 3, device=d), EXACT),
        (lambda d: torch.tensor(5.0, device=d), EXACT),
    ]
    for make, tol in pairs:
        got = make(DEVICE)
        expected = make("cpu")
        assert got.device == DEVICE
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got.cpu(), expected, **tol)


def test_scalar_reads():
    x = torch.tensor([1.5, -2.0, 3.25], device=DEVICE)
    assert x[2].item() == 3.25
    assert x.tolist() == [1.5, -2.0, 3.25]
    assert float(x.sum()) == 2.75
    assert int(torch.tensor(7, device=DEVICE)) == 7
    assert bool((x > 0).any())
    assert x.numpy(force=True).tolist() == [1.5, -2.0, 3.25]
