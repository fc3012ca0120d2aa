"""Gathers and joins as plain copies between device buffers (native_gather_ops.cpp).

index_select along dim 0 of a contiguous tensor (embedding lookups reach it through
`F.embedding`) and cat of contiguous tensors of one dtype. The reference is CPU eager on the
same inputs: these copy bytes, so results must be bit for bit equal (rtol=0, atol=0), bad
arguments must raise CPU eager's error, and the calls the kernels leave to the typed host
kernel (another dim, strided inputs, int32 or host indices, mixed dtypes, large joins)
must match the CPU too. Which path ran is read from the "aten::index_select" and
"aten::cat" native run counters. Also run in both launch modes by scripts/test.sh.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import torchneuron

DEV = "neuron"


def _runs(op: str = "aten::index_select") -> int:
    return torchneuron._C._native_kernel_runs().get(op, 0)


def _table(rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(rows * 31 + cols)
    return (torch.randn(rows, cols, generator=g, dtype=torch.float64) * 100).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64, torch.int64])
@pytest.mark.parametrize(
    "index",
    [[2, 0], [5, 5, 1, 15], [], 7],  # duplicates, empty, a 0-dim index
    ids=["two", "duplicates", "empty", "scalar"],
)
def test_rows_are_gathered_as_on_cpu(dtype: torch.dtype, index: list[int] | int) -> None:
    table, idx = _table(16, 4, dtype), torch.tensor(index, dtype=torch.long)
    before = _runs()
    result = torch.index_select(table.to(DEV), 0, idx.to(DEV))
    expected = torch.index_select(table, 0, idx)
    torch.testing.assert_close(result.cpu(), expected, rtol=0, atol=0)
    assert result.stride() == expected.stride()
    assert _runs() == before + 1


def test_embedding_lookups_and_their_gradient() -> None:
    weight = _table(32, 8, torch.float32)
    ids = torch.tensor([[3, 1, 3], [0, 31, 7]])
    w_cpu = weight.clone().requires_grad_()
    w_dev = weight.to(DEV).requires_grad_()
    before = _runs()
    out_dev = F.embedding(ids.to(DEV), w_dev)
    out_cpu = F.embedding(ids, w_cpu)
    assert _runs() == before + 1
    torch.testing.assert_close(out_dev.cpu(), out_cpu, rtol=0, atol=0)
    grad = torch.randn(out_cpu.shape)
    out_cpu.backward(grad)
    out_dev.backward(grad.to(DEV))
    # Rows picked twice accumulate two products in the backward's own order: float32 tolerance.
    torch.testing.assert_close(w_dev.grad.cpu(), w_cpu.grad, rtol=1e-6, atol=1e-6)


def test_a_large_table_launched_on_the_stream() -> None:
    table, idx = _table(1024, 256, torch.float32), torch.tensor([1023, 0, 512])  # 1 MiB
    before = _runs()
    result = torch.index_select(table.to(DEV), 0, idx.to(DEV))
    torch.testing.assert_close(result.cpu(), table[idx], rtol=0, atol=0)
    assert _runs() == before + 1  # on the stream's worker unless launches block


@pytest.mark.parametrize("bad", [16, -1], ids=["past the end", "negative"])
def test_out_of_range_indices_raise_cpu_eagers_error(bad: int) -> None:
    table, idx = _table(16, 4, torch.float32), torch.tensor([0, bad])
    with pytest.raises(IndexError) as cpu_error:
        torch.index_select(table, 0, idx)
    with pytest.raises(IndexError, match=re.escape(str(cpu_error.value))):
        torch.index_select(table.to(DEV), 0, idx.to(DEV))
        torch.neuron.synchronize()


@pytest.mark.parametrize(
    "case",
    [
        ("dim 1", lambda t, i, d: torch.index_select(t.to(d), 1, i.to(d))),
        ("dim -1", lambda t, i, d: torch.index_select(t.to(d), -1, i.to(d))),
        ("strided table", lambda t, i, d: torch.index_select(t.to(d).t(), 0, i.to(d))),
        ("int32 index", lambda t, i, d: torch.index_select(t.to(d), 0, i.int().to(d))),
        ("2-D index", lambda t, i, d: torch.index_select(t.to(d), 0, i.view(1, 2).to(d))),
    ],
    ids=lambda case: case[0],
)
def test_other_calls_take_the_typed_kernel(case: tuple[str, Callable]) -> None:
    _, fn = case
    table, idx = _table(6, 6, torch.float32), torch.tensor([4, 1])
    try:
        expected = fn(table, idx, "cpu")
    except (RuntimeError, IndexError) as error:
        with pytest.raises(type(error), match=re.escape(str(error).splitlines()[0])):
            fn(table, idx, DEV)
            torch.neuron.synchronize()
        return
    before = _runs()
    result = fn(table, idx, DEV)
    torch.testing.assert_close(result.cpu(), expected, rtol=0, atol=0)
    assert _runs() == before


def test_a_host_index_is_refused_as_on_other_devices() -> None:
    table = _table(6, 6, torch.float32).to(DEV)
    with pytest.raises(RuntimeError, match="same device|Expected all tensors"):
        torch.index_select(table, 0, torch.tensor([1]))


# ---- cat ---------------------------------------------------------------------------------


def _block(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * 100).to(dtype)


JOINS = [
    ("rows", [(2, 3), (4, 3)], 0),
    ("columns", [(2, 3), (2, 1), (2, 5)], 1),
    ("last dim, negative", [(3, 2, 2), (3, 2, 4)], -1),
    ("KV-cache append", [(1, 2, 5, 4), (1, 2, 1, 4)], 2),
    ("vectors with an empty one", [(3,), (0,), (2,)], 0),
    ("one tensor", [(2, 2)], 1),
    ("empty along another dim", [(0, 3), (0, 2)], 1),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
@pytest.mark.parametrize("join", JOINS, ids=lambda join: join[0])
def test_cat_joins_blocks_as_on_cpu(join: tuple, dtype: torch.dtype) -> None:
    _, shapes, dim = join
    parts = [_block(shape, dtype, i) for i, shape in enumerate(shapes)]
    before = _runs("aten::cat")
    result = torch.cat([p.to(DEV) for p in parts], dim)
    expected = torch.cat(parts, dim)
    torch.testing.assert_close(result.cpu(), expected, rtol=0, atol=0)
    assert result.stride() == expected.stride()
    assert _runs("aten::cat") == before + 1


def test_cat_gradient_splits_back() -> None:
    a, b = _block((2, 3), torch.float32, 1), _block((2, 2), torch.float32, 2)
    a_dev, b_dev = a.to(DEV).requires_grad_(), b.to(DEV).requires_grad_()
    a_cpu, b_cpu = a.clone().requires_grad_(), b.clone().requires_grad_()
    grad = _block((2, 5), torch.float32, 3)
    torch.cat([a_dev, b_dev], 1).backward(grad.to(DEV))
    torch.cat([a_cpu, b_cpu], 1).backward(grad)
    torch.testing.assert_close(a_dev.grad.cpu(), a_cpu.grad, rtol=0, atol=0)
    torch.testing.assert_close(b_dev.grad.cpu(), b_cpu.grad, rtol=0, atol=0)


@pytest.mark.parametrize(
    "case",
    [
        (
            "mixed dtypes",
            lambda d: torch.cat(
                [torch.ones(2, 2, device=d), torch.ones(2, 2, device=d, dtype=torch.float64)]
            ),
        ),
        (
            "a strided input",
            lambda d: torch.cat(
                [torch.arange(6.0, device=d).view(2, 3).t(), torch.ones(3, 1, device=d)], 1
            ),
        ),
        (
            "a legacy empty vector",
            lambda d: torch.cat([torch.ones(2, 2, device=d), torch.ones(0, device=d)]),
        ),
        (
            "over 1 MiB",
            lambda d: torch.cat([torch.arange(2.0**18, device=d), torch.arange(2.0**18, device=d)]),
        ),
        (
            "sizes that differ",
            lambda d: torch.cat([torch.ones(2, 2, device=d), torch.ones(3, 3, device=d)]),
        ),
        ("dim out of range", lambda d: torch.cat([torch.ones(2, 2, device=d)], 2)),
        ("a 0-dim tensor", lambda d: torch.cat([torch.ones((), device=d)])),
    ],
    ids=lambda case: case[0],
)
def test_other_joins_take_the_typed_kernel(case: tuple[str, Callable]) -> None:
    _, fn = case
    try:
        expected = fn("cpu")
    except (RuntimeError, IndexError) as error:
        with pytest.raises(type(error), match=re.escape(str(error).splitlines()[0])):
            fn(DEV)
            torch.neuron.synchronize()
        return
    before = _runs("aten::cat")
    result = fn(DEV)
    torch.testing.assert_close(result.cpu(), expected, rtol=0, atol=0)
    assert _runs("aten::cat") == before


# ---- x[rows]: aten::index with one integer tensor ------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize(
    "rows",
    [[2, 0], [-1, 3, -4, 3], [[1, 2], [0, 3]], []],
    ids=["two", "negative and duplicates", "2-D", "empty"],
)
def test_indexing_with_a_tensor_picks_rows_as_on_cpu(dtype: torch.dtype, rows: list) -> None:
    table, idx = _block((4, 3, 2), dtype, 4), torch.tensor(rows, dtype=torch.long)
    before = _runs("aten::index.Tensor")
    result = table.to(DEV)[idx.to(DEV)]
    expected = table[idx]
    torch.testing.assert_close(result.cpu(), expected, rtol=0, atol=0)
    assert result.stride() == expected.stride()
    assert _runs("aten::index.Tensor") == before + 1


@pytest.mark.parametrize("bad", [4, -5], ids=["past the end", "before the start"])
def test_indexing_out_of_bounds_raises_cpu_eagers_error(bad: int) -> None:
    table, idx = _block((4, 3), torch.float32, 5), torch.tensor([0, bad])
    with pytest.raises(IndexError) as cpu_error:
        table[idx]
    with pytest.raises(IndexError, match=re.escape(str(cpu_error.value))):
        table.to(DEV)[idx.to(DEV)]
        torch.neuron.synchronize()


def test_indexing_gradient_accumulates_picked_rows() -> None:
    table, idx = _block((5, 3), torch.float32, 6), torch.tensor([4, 0, 4])
    t_dev, t_cpu = table.to(DEV).requires_grad_(), table.clone().requires_grad_()
    grad = _block((3, 3), torch.float32, 7)
    t_dev[idx.to(DEV)].backward(grad.to(DEV))
    t_cpu[idx].backward(grad)
    # Row 4 gets two gradients added, in the backward's own order: float32 tolerance.
    torch.testing.assert_close(t_dev.grad.cpu(), t_cpu.grad, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "case",
    [
        ("a boolean mask", lambda t, d: t.to(d)[t.to(d) > 0]),
        (
            "two index tensors",
            lambda t, d: t.to(d)[torch.tensor([0, 2], device=d), torch.tensor([1, 1], device=d)],
        ),
        ("an index on dim 1", lambda t, d: t.to(d)[:, torch.tensor([2, 0], device=d)]),
        ("a host index tensor", lambda t, d: t.to(d)[torch.tensor([2, 0])]),
        ("an int32 index", lambda t, d: t.to(d)[torch.tensor([2, 0], dtype=torch.int32, device=d)]),
        ("a strided table", lambda t, d: t.to(d).t()[torch.tensor([1, 0], device=d)]),
    ],
    ids=lambda case: case[0],
)
def test_other_indexing_takes_the_host_kernels(case: tuple[str, Callable]) -> None:
    _, fn = case
    table = _block((3, 3), torch.float32, 8)
    before = _runs("aten::index.Tensor")
    result = fn(table, DEV)
    torch.testing.assert_close(result.cpu(), fn(table, "cpu"), rtol=0, atol=0)
    assert _runs("aten::index.Tensor") == before
