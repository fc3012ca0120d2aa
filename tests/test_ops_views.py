"""Indexing, views, out= variants, joining and splitting on neuron, checked against the CPU."""

from __future__ import annotations

import warnings

import pytest
import torch
from support.op_check import DEVICE, EXACT, FP32, Const, check, idx, r

# ---------------------------------------------------------------------------- indexing


def index_put(x, v, i):
    return x.clone().index_put_((i,), v, accumulate=False)


def index_put_accumulate(x, v, i):
    return x.clone().index_put_((i,), v, accumulate=True)


INDEXING = {
    "advanced_rows": (lambda x, i: x[i], lambda: [r(6, 4), idx(6, 5)]),
    "advanced_cols": (lambda x, i: x[:, i], lambda: [r(6, 4), idx(4, 3)]),
    "advanced_2d": (lambda x, i, j: x[i, j], lambda: [r(6, 4), idx(6, 5), idx(4, 5)]),
    "advanced_broadcast": (
        lambda x, i, j: x[i[:, None], j],
        lambda: [r(6, 4), idx(6, 3), idx(4, 2)],
    ),
    "bool_mask": (lambda x: x[x > 0.2], lambda: [r(6, 4)]),
    "setitem_mask": (lambda x: x.clone().masked_fill(x < 0, 0.0) * 2, lambda: [r(6, 4)]),
    "index_put": (index_put, lambda: [r(6, 4), r(4), torch.tensor([1, 3, 5])]),
    "index_put_accumulate": (
        index_put_accumulate,
        lambda: [r(6, 4), r(5, 4), torch.tensor([1, 3, 1, 0, 3])],
    ),
    "masked_fill": (lambda x, m: x.masked_fill(m, -1.5), lambda: [r(6, 4), torch.rand(6, 4) > 0.5]),
    "masked_fill_broadcast": (
        lambda x, m: x.masked_fill(m, 0.0),
        lambda: [r(6, 4), torch.rand(1, 4) > 0.5],
    ),
    "masked_select": (lambda x, m: x.masked_select(m), lambda: [r(6, 4), torch.rand(6, 4) > 0.5]),
    "masked_scatter": (
        lambda x, m, s: x.masked_scatter(m, s),
        lambda: [r(6, 4), torch.rand(6, 4) > 0.5, r(24)],
    ),
    "scatter_add": (
        lambda x, i, s: x.scatter_add(1, i, s),
        lambda: [r(3, 5), idx(5, 3, 4), r(3, 4)],
    ),
    "scatter": (
        lambda x, s: x.scatter(0, torch.tensor([[2, 0, 1, 2]], device=x.device), s),
        lambda: [r(3, 4), r(1, 4)],
    ),
    "scatter_reduce_amax": (
        lambda x, i, s: x.scatter_reduce(0, i, s, reduce="amax", include_self=False),
        lambda: [r(4, 3), idx(4, 6, 3), r(6, 3)],
    ),
    "gather": (lambda x, i: x.gather(1, i), lambda: [r(4, 6), idx(6, 4, 3)]),
    "index_select": (lambda x, i: x.index_select(1, i), lambda: [r(4, 6), idx(6, 8)]),
    "index_add": (
        lambda x, s, i: x.index_add(0, i, s, alpha=2.0),
        lambda: [r(5, 3), r(4, 3), torch.tensor([0, 4, 0, 2])],
    ),
    "index_copy": (
        lambda x, s, i: x.index_copy(0, i, s),
        lambda: [r(5, 3), r(2, 3), torch.tensor([3, 1])],
    ),
    "index_fill": (lambda x, i: x.index_fill(1, i, 7.0), lambda: [r(4, 5), torch.tensor([0, 3])]),
    "take": (lambda x, i: torch.take(x, i), lambda: [r(4, 5), idx(20, 7)]),
    "take_along_dim": (
        lambda x, i: torch.take_along_dim(x, i, dim=1),
        lambda: [r(4, 5), idx(5, 4, 2)],
    ),
    "nonzero": (lambda x: torch.nonzero(x > 0), lambda: [r(5, 4)]),
    "nonzero_tuple": (lambda x: torch.nonzero(x > 0, as_tuple=True), lambda: [r(5, 4)]),
    "argwhere": (lambda x: torch.argwhere(x > 0.5), lambda: [r(5, 4)]),
    "where_cond_only": (lambda x: torch.where(x > 0), lambda: [r(5, 4)]),
    "put": (
        lambda x, s: x.clone().put_(torch.tensor([0, 7, 3], device=x.device), s),
        lambda: [r(3, 4), r(3)],
    ),
    "searchsorted": (
        lambda s, v: torch.searchsorted(s, v),
        lambda: [Const(torch.sort(r(10)).values), Const(r(6))],
    ),
    "tensor_split_index": (lambda x: x[1:4:2, [0, 2]], lambda: [r(6, 4)]),
    "ellipsis_none": (lambda x: x[..., None, 1] * x[None, 0, :, 2:3], lambda: [r(2, 3, 4)]),
}


@pytest.mark.parametrize("name", list(INDEXING))
def test_indexing(name):
    torch.manual_seed(0)
    fn, factory = INDEXING[name]
    check(fn, factory())


def test_setitem_forms_match_cpu():
    torch.manual_seed(0)
    cpu = torch.randn(6, 5)
    dev = cpu.to(DEVICE)
    index = torch.tensor([4, 1])
    for target in (cpu, dev):
        target[0] = 1.0
        target[:, 1] = torch.arange(6.0, device=target.device)
        target[target > 1.5] = -1.0
        target[index.to(target.device), 2] = torch.tensor([9.0, 8.0], device=target.device)
        target[2:4, 3:] += 10.0
        target[[0, 5], [4, 4]] = 3.0
    torch.testing.assert_close(dev.cpu(), cpu, **EXACT)


# ---------------------------------------------------------------------------- views

VIEWS = {
    "view": lambda x: x.view(-1) * 2,
    "view_as_dims": lambda x: x.view(3, 2, 4),
    "reshape_noncontig": lambda x: x.t().reshape(-1),
    "transpose": lambda x: x.transpose(0, 1),
    "permute": lambda x: x.view(2, 3, 4).permute(2, 0, 1),
    "expand": lambda x: x[:, :1].expand(6, 5),
    "expand_then_op": lambda x: x[:1].expand(4, 4) * x[:4],
    "narrow": lambda x: x.narrow(1, 1, 2),
    "unfold": lambda x: x.unfold(0, 2, 2),
    "as_strided": lambda x: x.as_strided((3, 3), (1, 3), 2),
    "diagonal": lambda x: x.diagonal(),
    "diagonal_offset": lambda x: x.diagonal(offset=1),
    "diag_embed": lambda x: torch.diag_embed(x[0]),
    "squeeze_unsqueeze": lambda x: x.unsqueeze(0).unsqueeze(-1).squeeze(0),
    "t": lambda x: x.t(),
    "flip": lambda x: x.flip(0, 1),
    "roll": lambda x: x.roll(2, dims=1),
    "repeat": lambda x: x.repeat(2, 1),
    "repeat_interleave": lambda x: x.repeat_interleave(2, dim=0),
    "tile": lambda x: x.tile((1, 2)),
    "movedim": lambda x: x.view(2, 3, 4).movedim(0, -1),
    "select": lambda x: x.select(1, 2),
    "slice_step": lambda x: x[::2, 1::2],
    "negative_step_flip": lambda x: x.flip(-1)[1:],
    "contiguous": lambda x: x.t().contiguous(),
    "unflatten_flatten": lambda x: x.unflatten(1, (2, 2)).flatten(0, 1),
    "view_as_real_like": lambda x: x.view(6, 2, 2).sum(-1),
    "split_views": lambda x: x.split(2, dim=1),
}


@pytest.mark.parametrize("name", list(VIEWS))
def test_view(name):
    torch.manual_seed(0)
    check(VIEWS[name], [r(6, 4)])


def test_views_share_storage():
    x = torch.arange(12.0, device=DEVICE).view(3, 4)
    for view in (x.t(), x[1], x.view(-1), x.narrow(1, 1, 2), x.diagonal(), x.unfold(1, 2, 1)):
        assert view.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        assert view.device == DEVICE
    assert x.t().stride() == (1, 4)
    assert x[:, 1:].storage_offset() == 1
    assert not x.t().is_contiguous()


def test_inplace_on_views_updates_base():
    base_cpu = torch.zeros(4, 5)
    base_dev = base_cpu.to(DEVICE)
    for base in (base_cpu, base_dev):
        base[1:3, ::2].add_(1.0)
        base.t()[0].fill_(5.0)
        base.diagonal().mul_(2.0)
        base.view(-1)[7] = 7.0
        base.narrow(0, 3, 1).sub_(0.5)
        base.unfold(1, 2, 2)[2].zero_()
        base[:, -1].copy_(torch.arange(4.0, device=base.device))
        base.as_strided((2,), (6,), 1).add_(100.0)
    torch.testing.assert_close(base_dev.cpu(), base_cpu, **EXACT)


def test_inplace_on_views_autograd():
    torch.manual_seed(0)

    def fn(x):
        y = x.clone()
        y[:, 0].mul_(2.0)
        y.t()[1].add_(y[:, 2])
        y.diagonal().exp_()
        return y.sin()

    check(fn, [r(4, 4)])


def test_inplace_ops_on_noncontiguous():
    torch.manual_seed(0)
    cpu = torch.randn(5, 6)
    dev = cpu.to(DEVICE)
    for x in (cpu, dev):
        view = x.t()
        view.mul_(2).add_(1).clamp_(-1, 2)
        x[::2].sigmoid_()
        x[:, 1::3].masked_fill_(x[:, 1::3] > 0.5, 0.0)
        x.relu_()
    torch.testing.assert_close(dev.cpu(), cpu, **FP32)


# ---------------------------------------------------------------------------- out= variants


def test_out_wrong_size_is_resized():
    torch.manual_seed(0)
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    na, nb = a.to(DEVICE), b.to(DEVICE)
    cases = [
        (lambda x, y, out: torch.add(x, x, out=out), (3, 4)),
        (lambda x, y, out: torch.mm(x, y, out=out), (3, 5)),
        (lambda x, y, out: torch.sum(x, 1, out=out), (3,)),
        (lambda x, y, out: torch.cat([x, x], 0, out=out), (6, 4)),
        (lambda x, y, out: torch.exp(x, out=out), (3, 4)),
        (
            lambda x, y, out: torch.index_select(
                y, 1, torch.tensor([0, 2], device=y.device), out=out
            ),
            (4, 2),
        ),
        (lambda x, y, out: torch.matmul(x, y, out=out), (3, 5)),
    ]
    for fn, shape in cases:
        for initial in (0, 1, 40):  # empty, too small, too large
            out_cpu = torch.full((initial,), -1.0)
            out_dev = out_cpu.to(DEVICE)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # resizing a non-empty out=
                returned = fn(na, nb, out_dev)
                fn(a, b, out_cpu)
            assert returned is out_dev
            assert out_dev.shape == shape
            assert out_dev.device == DEVICE
            torch.testing.assert_close(out_dev.cpu(), out_cpu, **FP32)


def test_out_tuple_and_noncontiguous_out():
    torch.manual_seed(0)
    x = torch.randn(4, 6)
    nx = x.to(DEVICE)
    values = torch.empty(0, device=DEVICE)
    indices = torch.empty(0, dtype=torch.long, device=DEVICE)
    torch.sort(nx, dim=1, out=(values, indices))
    ref = torch.sort(x, dim=1)
    torch.testing.assert_close(values.cpu(), ref.values, **EXACT)
    torch.testing.assert_close(indices.cpu(), ref.indices, **EXACT)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # resizing a non-empty out=
        torch.max(nx, 0, out=(values, indices))
    torch.testing.assert_close(values.cpu(), x.max(0).values, **EXACT)
    # out= into a strided view writes through to the base.
    base = torch.zeros(6, 4, device=DEVICE)
    torch.mul(nx, 2.0, out=base.t())
    torch.testing.assert_close(base.cpu(), (x * 2).t(), **EXACT)


def test_out_resize_keeps_views_consistent():
    out = torch.empty(2, device=DEVICE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # resizing a non-empty out=
        torch.arange(0, 1000, dtype=torch.float32, device=DEVICE, out=out)
    assert out.shape == (1000,)
    torch.testing.assert_close(out.cpu(), torch.arange(0.0, 1000.0), **EXACT)
    assert out.untyped_storage().nbytes() >= 4000


# ---------------------------------------------------------------------------- joining, splitting

JOIN = {
    "cat": lambda a, b: torch.cat([a, b], dim=1),
    "cat_dim0_3": lambda a, b: torch.cat([a, b, a], dim=0),
    "stack": lambda a, b: torch.stack([a, b], dim=2),
    "hstack": lambda a, b: torch.hstack([a, b]),
    "split": lambda a, b: torch.split(a, [1, 3], dim=0),
    "split_size": lambda a, b: b.split(2, dim=1),
    "chunk": lambda a, b: a.chunk(3, dim=1),
    "unbind": lambda a, b: b.unbind(0),
    "tensor_split": lambda a, b: torch.tensor_split(a, [1, 3], dim=1),
    "meshgrid": lambda a, b: torch.meshgrid(a[0], b[1], indexing="ij"),
    "broadcast_tensors": lambda a, b: torch.broadcast_tensors(a[:, :1], b[:1]),
}


@pytest.mark.parametrize("name", list(JOIN))
def test_join_split(name):
    torch.manual_seed(0)
    check(JOIN[name], [r(4, 5), r(4, 5)])


def test_cat_with_empty_and_mixed_dtype():
    a = torch.randn(2, 3)
    cases = [[a, torch.empty(0)], [a, a.to(torch.float64)], [a.to(torch.bfloat16), a]]
    for tensors in cases:
        expected = torch.cat(tensors)
        got = torch.cat([t.to(DEVICE) for t in tensors])
        assert got.dtype == expected.dtype
        torch.testing.assert_close(got.cpu(), expected, **EXACT)
