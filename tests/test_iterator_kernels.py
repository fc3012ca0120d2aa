"""Elementwise ops and copy_ run through PyTorch's CPU loops over device memory.

csrc/aten/host_kernels/host_iterator_kernels.cpp hands a TensorIterator over neuron tensors
straight to the op's CPU DispatchStub for floating operands of one dtype on one device; every
other call takes the typed host kernel over aliases. The reference is CPU eager on the same
inputs: the loop is the CPU's own, so results must be bit for bit equal (rtol=0, atol=0),
errors must carry the CPU's message, and which path ran is read from the "cpu_loop <op>" run
counters.
Also run in both launch modes by scripts/test.sh.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch

import torchneuron

DEV = "neuron"
FLOATING = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def _loop_runs(op: str) -> int:
    return torchneuron._C._native_kernel_runs().get(f"cpu_loop {op}", 0)


def _inputs(
    shape: tuple[int, ...], dtype: torch.dtype, seed: int, positive: bool = False
) -> torch.Tensor:
    """Magnitudes in [0.25, 4.25): no zero divisors; signs random unless `positive`."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(shape, generator=g, dtype=torch.float64) * 4 + 0.25
    sign = torch.randint(0, 2, shape, generator=g) * 2 - 1
    return (x if positive else x * sign).to(dtype)


BINARY: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "aten::add.Tensor": lambda a, b: torch.add(a, b, alpha=0.5),
    "aten::sub.Tensor": lambda a, b: torch.sub(a, b, alpha=2),
    "aten::mul.Tensor": torch.mul,
    "aten::div.Tensor": torch.div,
}
IN_PLACE: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "aten::add_.Tensor": lambda a, b: a.add_(b, alpha=3),
    "aten::sub_.Tensor": lambda a, b: a.sub_(b),
    "aten::mul_.Tensor": lambda a, b: a.mul_(b),
    "aten::div_.Tensor": lambda a, b: a.div_(b),
}
UNARY: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "aten::neg": torch.neg,
    "aten::exp": torch.exp,
    "aten::rsqrt": torch.rsqrt,
    "aten::sqrt": torch.sqrt,
    "aten::tanh": torch.tanh,
    "aten::sigmoid": torch.sigmoid,
    "aten::relu": torch.relu,
}

# (self shape, other shape): same, broadcast both ways, 0-dim, empty, and large enough
# (300x300 float32 = 360 KB) to be launched on the stream by default.
BINARY_SHAPES = [
    ((4, 4), (4, 4)),
    ((3, 1), (1, 5)),
    ((), ()),
    ((2, 3), ()),
    ((0, 3), (0, 3)),
    ((300, 300), (300, 300)),
]


def _equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.device.type == DEV
    torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0, equal_nan=True)
    assert actual.stride() == expected.stride()


@pytest.mark.parametrize("dtype", FLOATING)
@pytest.mark.parametrize("shapes", BINARY_SHAPES)
@pytest.mark.parametrize("op", list(BINARY))
def test_binary_ops_run_the_cpu_loop(op: str, shapes: tuple, dtype: torch.dtype) -> None:
    a, b = _inputs(shapes[0], dtype, 1), _inputs(shapes[1], dtype, 2)
    before = _loop_runs(op)
    result = BINARY[op](a.to(DEV), b.to(DEV))
    _equal(result, BINARY[op](a, b))
    assert _loop_runs(op) == before + 1


@pytest.mark.parametrize("dtype", FLOATING)
@pytest.mark.parametrize("op", list(IN_PLACE))
def test_in_place_ops_write_the_argument(op: str, dtype: torch.dtype) -> None:
    a, b = _inputs((5, 6), dtype, 3), _inputs((6,), dtype, 4)  # b broadcasts into a
    x = a.to(DEV)
    view = x[1:]  # a view of x sees the write
    before = _loop_runs(op)
    returned = IN_PLACE[op](x, b.to(DEV))
    expected = IN_PLACE[op](a.clone(), b)
    assert returned is x
    _equal(x, expected)
    _equal(view, expected[1:])
    assert _loop_runs(op) == before + 1


@pytest.mark.parametrize("dtype", FLOATING)
@pytest.mark.parametrize("op", list(UNARY))
def test_unary_ops_run_the_cpu_loop(op: str, dtype: torch.dtype) -> None:
    x = _inputs((7, 9), dtype, 5, positive=op in ("aten::rsqrt", "aten::sqrt"))
    before = _loop_runs(op)
    # A transposed (non-contiguous) input: the output takes the CPU's strides.
    _equal(UNARY[op](x.to(DEV).t()), UNARY[op](x.t()))
    assert _loop_runs(op) == before + 1


def test_autograd_through_the_loops_matches_cpu() -> None:
    a, b = _inputs((4, 5), torch.float32, 6), _inputs((5,), torch.float32, 7)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (torch.relu(x * y - x / (y.abs() + 1)).sigmoid() + torch.tanh(x)).exp().sum()

    x, y = a.clone().requires_grad_(), b.clone().requires_grad_()
    step(x, y).backward()
    xd = a.to(DEV).requires_grad_()
    yd = b.to(DEV).requires_grad_()
    step(xd, yd).backward()
    # The sum reduces in a different order on the device's host kernel: float32 tolerance.
    torch.testing.assert_close(xd.grad.cpu(), x.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(yd.grad.cpu(), y.grad, rtol=1e-6, atol=1e-6)


# ---- calls the loop leaves to the typed host kernel, which must behave as CPU eager -------


@pytest.mark.parametrize(
    "case",
    [
        (
            "mixed dtypes",
            "aten::add.Tensor",
            lambda d: torch.ones(3, device=d) + torch.ones(3, device=d, dtype=torch.float64),
        ),
        (
            "integers",
            "aten::mul.Tensor",
            lambda d: torch.arange(6, device=d) * torch.arange(6, device=d),
        ),
        (
            "a CPU scalar tensor",
            "aten::mul.Tensor",
            lambda d: torch.ones(3, device=d) * torch.tensor(2.5),
        ),
        ("a Python number", "aten::div.Tensor", lambda d: torch.ones(3, device=d) / 4),
        ("complex", "aten::neg", lambda d: torch.neg(torch.ones(3, device=d, dtype=torch.cfloat))),
        ("integer rsqrt", "aten::rsqrt", lambda d: torch.rsqrt(torch.arange(1, 5, device=d))),
    ],
    ids=lambda case: case[0],
)
def test_other_calls_fall_back_with_cpu_results(case: tuple) -> None:
    _, op, fn = case
    before = _loop_runs(op)
    result = fn(DEV)
    expected = fn("cpu")
    assert result.dtype == expected.dtype
    torch.testing.assert_close(result.cpu(), expected, rtol=0, atol=0)
    assert _loop_runs(op) == before  # the typed host kernel ran it


def _cpu_error(fn: Callable[[str], object]) -> str:
    with pytest.raises(RuntimeError) as info:
        fn("cpu")
    return str(info.value)


@pytest.mark.parametrize(
    "case",
    [
        # The output cannot grow to the broadcast shape in place.
        ("in-place broadcast", lambda d: torch.ones(3, device=d).add_(torch.ones(2, 3, device=d))),
        (
            "shapes that do not broadcast",
            lambda d: torch.ones(3, device=d) * torch.ones(4, device=d),
        ),
        # Several elements of the written tensor share memory.
        (
            "internal overlap",
            lambda d: torch.ones(1, 3, device=d).expand(2, 3).mul_(torch.ones(2, 3, device=d)),
        ),
        ("partial overlap", lambda d: (lambda t: t[1:].add_(t[:-1]))(torch.ones(4, device=d))),
        (
            "bool alpha",
            lambda d: torch.add(torch.ones(2, device=d), torch.ones(2, device=d), alpha=True),
        ),
    ],
    ids=lambda case: case[0],
)
def test_errors_are_cpu_eagers(case: tuple) -> None:
    _, fn = case
    expected = _cpu_error(fn)
    with pytest.raises(RuntimeError, match=re.escape(expected.splitlines()[0])):
        fn(DEV)
        torch.neuron.synchronize()


def test_devices_must_match() -> None:
    with pytest.raises(RuntimeError, match="same device"):
        torch.ones(3, device=DEV) + torch.ones(3, 3)


# ---- copy_ -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case",
    [
        ("same dtype", (4, 5), torch.float32, torch.float32, lambda s: s),
        ("to bfloat16", (4, 5), torch.float32, torch.bfloat16, lambda s: s),
        ("from integers", (4, 5), torch.int64, torch.float32, lambda s: s),
        ("to bool", (4, 5), torch.float32, torch.bool, lambda s: s),
        ("strided source", (6, 8), torch.float32, torch.float16, lambda s: s[::2, 1::3]),
        ("broadcast source", (5,), torch.float64, torch.float32, lambda s: s.expand(3, 5)),
        ("large", (300, 300), torch.float32, torch.float32, lambda s: s),
    ],
    ids=lambda case: case[0],
)
def test_copy_between_device_tensors(case: tuple) -> None:
    _, shape, src_dtype, dst_dtype, view = case
    base = (_inputs(shape, torch.float64, 8) * 10).to(src_dtype)
    src = view(base)
    expected = torch.empty(src.shape, dtype=dst_dtype).copy_(src)
    dst = torch.empty(src.shape, dtype=dst_dtype, device=DEV)
    before = _loop_runs("aten::copy_")
    returned = dst.copy_(view(base.to(DEV)))
    assert returned is dst
    _equal(dst, expected)
    assert _loop_runs("aten::copy_") == before + 1


def test_copy_of_a_large_transpose_keeps_the_cpu_blockwise_copy() -> None:
    base = _inputs((80, 70), torch.float32, 9)
    dev_src = base.to(DEV).t()  # 2-D, transposed, >= 60x60 elements
    dst = torch.empty(70, 80, device=DEV)
    before = _loop_runs("aten::copy_")
    dst.copy_(dev_src)
    _equal(dst, base.t().contiguous())
    assert _loop_runs("aten::copy_") == before


def test_copy_onto_itself_and_overlaps() -> None:
    x = torch.arange(6.0, device=DEV)
    alias = x.view(2, 3).view(6)  # the same elements through another tensor: nothing to do
    assert x.copy_(alias) is x
    _equal(x, torch.arange(6.0))
    expected = _cpu_error(lambda d: (lambda t: t[1:].copy_(t[:-1]))(torch.arange(6.0, device=d)))
    with pytest.raises(RuntimeError, match=re.escape(expected.splitlines()[0])):
        x[1:].copy_(x[:-1])
        torch.neuron.synchronize()
