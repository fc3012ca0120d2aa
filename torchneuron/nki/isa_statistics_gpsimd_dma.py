"""``nisa`` statistics (bn_stats/bn_aggr), GpSimd (iota, memset, affine_select,
tensor_partition_reduce) and DMA (dma_copy) instructions."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dtypes, indirect_dma, interpreter, ops
from .chip_profile import BN_STATS_FMAX
from .errors import NkiError
from .indirect_dma import VectorIndirectView
from .instruction import instruction, on_chip_operand
from .language import dma, ndarray
from .tiles import IndirectAccess, Tile


# -- statistics --------------------------------------------------------------------------
# bn_stats writes, per partition and per chunk of at most 512 elements, two triples
# (count, mean, variance) for the chunk's even and odd elements; bn_aggr combines any
# number of such triples (Chan's parallel variance) into [mean, variance].
@ops.row_wise
def _bn_stats_body(x: Any) -> Any:
    x = ops.f32(x).reshape(x.shape[0], -1)
    even, odd = x[:, 0::2], x[:, 1::2]
    out = np.zeros((x.shape[0], 6), np.float32)
    for n, part in enumerate((even, odd)):
        if part.shape[1]:
            out[:, 3 * n] = part.shape[1]
            out[:, 3 * n + 1] = part.mean(axis=1)
            out[:, 3 * n + 2] = part.var(axis=1)
    return out


@ops.row_wise
def _bn_aggr_body(stats: Any) -> Any:
    s = ops.f32(stats).reshape(stats.shape[0], -1, 3)
    count, mean, var = s[..., 0], s[..., 1], s[..., 2]
    total = count.sum(axis=1)
    safe = np.where(total > 0, total, 1)
    grand = (count * mean).sum(axis=1) / safe
    m2 = (count * (var + (mean - grand[:, None]) ** 2)).sum(axis=1) / safe
    return np.stack([grand, m2], axis=1)


def _bn_stats_of_window(x: Any, keep: Any) -> Any:
    """bn_stats over the elements of each partition that `keep` selects (the instruction's
    access pattern is the masked window: elements outside it take no part)."""
    x = ops.f32(x).reshape(x.shape[0], -1)
    keep = keep.reshape(x.shape[0], -1)
    if (keep == keep[:1]).all():  # one window for every partition (a free-axis mask)
        return _bn_stats_body(x[:, keep[0]])
    return np.concatenate([_bn_stats_body(x[r : r + 1, keep[r]]) for r in range(x.shape[0])])


_bn_stats_body.lowering = ("bn_stats",)  # type: ignore[attr-defined]
_bn_aggr_body.lowering = ("bn_aggr",)  # type: ignore[attr-defined]


@instruction("vector")
def bn_stats(dst: Tile, data: Tile, mask: Any = None, **_: Any) -> None:
    """Mean/variance statistics of each partition's (at most 512) elements, 6 per partition."""
    data = on_chip_operand(data, "nisa.bn_stats")
    if ops.free_size(data.shape) > BN_STATS_FMAX:
        raise NkiError(
            f"nisa.bn_stats: free size {ops.free_size(data.shape)} exceeds {BN_STATS_FMAX} "
            "(nl.tile_size.bn_stats_fmax); compute stats per chunk and aggregate with bn_aggr"
        )
    if dst.shape != (data.shape[0], 6):
        raise NkiError(f"nisa.bn_stats: dst must have shape [{data.shape[0]}, 6], got {dst.shape}")
    body: Any = _bn_stats_body
    ins: list[Any] = [data]
    if mask is not None and not ops.mask_fits(mask, dst.shape):
        # A mask over the input (AWS's layernorm tutorial masks the last chunk's columns):
        # the statistics are those of the masked window, written to every partition that has
        # an element in it.
        if not ops.mask_fits(mask, data.shape):
            raise NkiError(
                f"nisa.bn_stats: a mask of shape {np.shape(mask)} fits neither the input "
                f"{data.shape} nor dst {dst.shape}"
            )
        keep = np.broadcast_to(np.asarray(mask, dtype=bool), data.shape)
        body, ins = _bn_stats_of_window, [data, keep]
        mask = keep.reshape(data.shape[0], -1).any(axis=1, keepdims=True)
    interpreter.execute(body, ins, [(dst, mask, "set")], "vector", ops.free_size(data.shape))


@bn_stats.legacy
def _bn_stats_legacy(data: Tile, *, mask: Any = None, dtype: Any = None, **_: Any) -> Tile:
    data = on_chip_operand(data, "nisa.bn_stats")
    out = ndarray((data.shape[0], 6), dtype or dtypes.float32)
    bn_stats.into(out, data, mask=mask)
    return out


@instruction("vector")
def bn_aggr(dst: Tile, data: Tile, mask: Any = None, **_: Any) -> None:
    """[mean, variance] per partition from concatenated bn_stats outputs."""
    data = on_chip_operand(data, "nisa.bn_aggr")
    if ops.free_size(data.shape) % 6:
        raise NkiError(
            f"nisa.bn_aggr: input free size must be a multiple of 6 (bn_stats), got {data.shape}"
        )
    if dst.shape != (data.shape[0], 2):
        raise NkiError(f"nisa.bn_aggr: dst must have shape [{data.shape[0]}, 2], got {dst.shape}")
    interpreter.execute(
        _bn_aggr_body, [data], [(dst, mask, "set")], "vector", ops.free_size(data.shape)
    )


@bn_aggr.legacy
def _bn_aggr_legacy(data: Tile, *, mask: Any = None, dtype: Any = None, **_: Any) -> Tile:
    data = on_chip_operand(data, "nisa.bn_aggr")
    out = ndarray((data.shape[0], 2), dtype or dtypes.float32)
    bn_aggr.into(out, data, mask=mask)
    return out


# -- GpSimd ------------------------------------------------------------------------------
@instruction("gpsimd")
def iota(dst: Tile, expr: Any, mask: Any = None, **_: Any) -> None:
    """dst = the values of an index expression (e.g. nl.arange(128)[:, None] * 4)."""
    values = np.asarray(expr)
    interpreter.execute(
        lambda: values, [], [(dst, mask, "set")], "gpsimd", ops.free_size(dst.shape)
    )


@iota.legacy
def _iota_legacy(expr: Any, dtype: Any, *, mask: Any = None, **_: Any) -> Tile:
    out = ndarray(np.shape(expr), dtype)
    iota.into(out, expr, mask=mask)
    return out


@instruction("gpsimd")
def memset(dst: Tile, value: Any, engine: Any = None, mask: Any = None, **_: Any) -> None:
    """dst[...] = value."""
    if not dst.buffer.on_chip:
        raise NkiError("nisa.memset writes SBUF/PSUM tiles")
    interpreter.execute(
        ops.constant_fn(value), [], [(dst, mask, "set")], "gpsimd", ops.free_size(dst.shape)
    )


@memset.legacy
def _memset_legacy(
    shape: Any, value: Any, dtype: Any, *, mask: Any = None, engine: Any = None, **_: Any
) -> Tile:
    out = ndarray(shape, dtype)
    memset.into(out, value, mask=mask)
    return out


@instruction("gpsimd")
def affine_select(
    dst: Tile, pred: Any, on_true_tile: Tile, on_false_value: Any, mask: Any = None, **_: Any
) -> None:
    """dst = on_true_tile where the affine predicate holds, else on_false_value."""
    data = on_chip_operand(on_true_tile, "nisa.affine_select")
    condition = np.asarray(pred, dtype=bool)
    fill = np.float32(on_false_value)
    interpreter.execute(
        lambda x: np.where(condition, ops.f32(x), fill),
        [data],
        [(dst, mask, "set")],
        "gpsimd",
        ops.free_size(data.shape),
    )


@affine_select.legacy
def _affine_select_legacy(
    pred: Any,
    on_true_tile: Tile,
    on_false_value: Any,
    *,
    mask: Any = None,
    dtype: Any = None,
    **_: Any,
) -> Tile:
    data = on_chip_operand(on_true_tile, "nisa.affine_select")
    out = ndarray(data.shape, dtype or data.dtype)
    affine_select.into(out, pred, data, on_false_value, mask=mask)
    return out


@instruction("gpsimd")
def tensor_partition_reduce(
    op: Any, data: Tile, *, mask: Any = None, dtype: Any = None, **_: Any
) -> Tile:
    """Reduction across partitions (GpSimd): [P, F] → [1, F]."""
    data = on_chip_operand(data, "nisa.tensor_partition_reduce")
    reducer = ops.REDUCE[ops.op_name(op)]
    out = ndarray((1,) + data.shape[1:], dtype or data.dtype)
    interpreter.execute(
        lambda x: reducer(ops.f32(x), axis=0, keepdims=True),
        [data],
        [(out, mask, "set")],
        "gpsimd",
        ops.free_size(data.shape) * data.shape[0],
    )
    return out


# -- DMA ---------------------------------------------------------------------------------
@instruction("dma")
def dma_copy(
    dst: Tile,
    src: Tile,
    mask: Any = None,
    dst_rmw_op: Any = None,
    oob_mode: Any = None,
    dge_mode: Any = None,
    **_: Any,
) -> None:
    """Copies src to dst through a DMA queue (HBM↔SBUF, or within either); either side may
    be an indirect view (``.ap(vector_offset=...)``: a gather or scatter, indirect_dma.py)."""
    indirect = (VectorIndirectView, IndirectAccess)
    if isinstance(dst, indirect) or isinstance(src, indirect):
        add = dst_rmw_op is not None
        if add and ops.op_name(dst_rmw_op) != "add":
            raise NkiError("nisa.dma_copy: dst_rmw_op supports nl.add only")
        skip = getattr(oob_mode, "name", oob_mode) == "skip"
        if isinstance(dst, IndirectAccess) or isinstance(src, IndirectAccess):
            indirect_dma.legacy_copy(dst, src, mask, skip, add, "nisa.dma_copy")
        else:
            indirect_dma.copy(dst, src, mask, skip, add, "nisa.dma_copy")
        return
    if not isinstance(dst, Tile) or not isinstance(src, Tile):
        raise NkiError("nisa.dma_copy takes tensors/tiles as dst and src")
    if dst.buffer.name == "psum" or src.buffer.name == "psum":
        raise NkiError("nisa.dma_copy moves HBM/SBUF data; PSUM is read with nisa.tensor_copy")
    if dst_rmw_op is not None:
        name = ops.op_name(dst_rmw_op)
        if name != "add":
            raise NkiError("nisa.dma_copy: dst_rmw_op supports nl.add only")
        interpreter.execute(
            interpreter._identity, [src], [(dst, mask, "acc")], "dma", int(np.prod(dst.shape))
        )
        return
    dma(dst, src, mask)
