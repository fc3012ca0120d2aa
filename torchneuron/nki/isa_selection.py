"""``nisa`` Vector Engine selection instructions: the top-8 family (``max8``,
``nc_find_index8``, ``nc_match_replace8``: how NKI kernels build top-k) and the predicated
copy (``tensor_copy_predicated``), in both API generations.

Each works per partition on the flattened free elements, in float32 (AWS, ``nki.isa``; the
NKI 0.8 documentation gives the duplicate-value rules followed here: ``nc_find_index8`` pairs
repeated values with their matches in ascending order, ``nc_match_replace8`` processes its
values from the last to the first, so repeated values take their matches in descending
order; a value not found gives the all-ones index).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dtypes, interpreter, ops
from .errors import NkiError
from .instruction import instruction, on_chip_operand
from .language import ndarray
from .tiles import Tile

TOP = 8
MAX_ELEMENTS = 16384  # per partition, for max8 / nc_find_index8 / nc_match_replace8


def _per_partition(tile: Tile, what: str, low: int = 1) -> int:
    count = ops.free_size(tile.shape)
    if not low <= count <= MAX_ELEMENTS:
        raise NkiError(
            f"{what}: {count} elements per partition; the instruction reads {low} to {MAX_ELEMENTS}"
        )
    return count


def _input_mask(mask: Any, tile: Tile, what: str) -> np.ndarray | None:
    """A mask over the data operand (these instructions apply mask= to their input)."""
    if mask is None:
        return None
    if not ops.mask_fits(mask, tile.shape):
        raise NkiError(f"{what}: mask of shape {np.shape(mask)} does not fit data {tile.shape}")
    return np.broadcast_to(np.asarray(mask, dtype=bool), tile.shape)


def _eight(tile: Tile, what: str) -> None:
    if ops.free_size(tile.shape) != TOP:
        raise NkiError(f"{what}: vals hold exactly 8 values per partition, got {tile.shape}")


@instruction("vector")
def max8(dst: Tile, src: Tile, mask: Any = None, **_: Any) -> None:
    """dst[p, :] = the 8 largest values of partition p, descending."""
    what = "nisa.max8"
    src = on_chip_operand(src, what)
    _per_partition(src, what, low=TOP)
    if dst.shape != (src.shape[0], TOP):
        raise NkiError(f"{what}: dst must be [{src.shape[0]}, 8], got {dst.shape}")
    where = _input_mask(mask, src, what)
    rows = src.shape[0]

    def body(x: Any, *keep: Any) -> Any:
        values = np.asarray(x, np.float32).reshape(rows, -1)
        if keep:
            values = np.where(np.asarray(keep[0]).reshape(rows, -1), values, -np.inf)
        return -np.sort(-values, axis=1)[:, :TOP]

    ins: list[Any] = [src] if where is None else [src, where]
    written = None if where is None else where.reshape(rows, -1).any(axis=1)[:, None]
    interpreter.execute(body, ins, [(dst, written, "set")], "vector", ops.free_size(src.shape))


@max8.legacy
def _max8_legacy(*, src: Tile, mask: Any = None, dtype: Any = None, **_: Any) -> Tile:
    src = on_chip_operand(src, "nisa.max8")
    out = ndarray((src.shape[0], TOP), dtype or src.dtype)
    max8.into(out, src, mask=mask)
    return out


def _find(values: np.ndarray, row: np.ndarray, taken: np.ndarray, order: range) -> np.ndarray:
    """Per value (in `order`), the first position of `row` equal to it and not yet taken."""
    found = np.full(len(values), -1, dtype=np.int64)
    for j in order:
        hits = np.flatnonzero((row == values[j]) & ~taken)
        if hits.size:
            found[j] = hits[0]
            taken[hits[0]] = True
    return found


@instruction("vector")
def nc_find_index8(dst: Tile, data: Tile, vals: Tile, mask: Any = None, **_: Any) -> None:
    """dst[p, j] = the index of vals[p, j]'s first occurrence in partition p of data."""
    what = "nisa.nc_find_index8"
    data, vals = on_chip_operand(data, what), on_chip_operand(vals, what)
    _per_partition(data, what, low=TOP)
    _eight(vals, what)
    if dst.shape[0] != data.shape[0] or ops.free_size(dst.shape) != TOP:
        raise NkiError(f"{what}: dst must be [{data.shape[0]}, 8], got {dst.shape}")
    if dst.dtype not in (dtypes.uint32, dtypes.uint16):
        raise NkiError(f"{what}: dst is uint32 or uint16, got {dtypes.name(dst.dtype)}")
    where = _input_mask(mask, data, what)
    rows = data.shape[0]
    sentinel = 0xFFFF if dst.dtype == dtypes.uint16 else 0xFFFFFFFF

    def body(x: Any, v: Any, *keep: Any) -> Any:
        x = np.asarray(x, np.float32).reshape(rows, -1)
        v = np.asarray(v, np.float32).reshape(rows, TOP)
        usable = np.asarray(keep[0]).reshape(rows, -1) if keep else np.ones(x.shape, bool)
        out = np.empty((rows, TOP), np.int64)
        for p in range(rows):
            out[p] = _find(v[p], x[p], ~usable[p], range(TOP))
        return np.where(out < 0, sentinel, out).astype(np.float64).reshape(dst.shape)

    ins: list[Any] = [data, vals] if where is None else [data, vals, where]
    interpreter.execute(body, ins, [(dst, None, "set")], "vector", ops.free_size(data.shape))


@nc_find_index8.legacy
def _nc_find_index8_legacy(
    *, data: Tile, vals: Tile, mask: Any = None, dtype: Any = None, **_: Any
) -> Tile:
    data = on_chip_operand(data, "nisa.nc_find_index8")
    out = ndarray((data.shape[0], TOP), dtype or dtypes.uint32)
    nc_find_index8.into(out, data, vals, mask=mask)
    return out


@instruction("vector")
def nc_match_replace8(
    dst: Tile,
    data: Tile,
    vals: Tile,
    imm: float,
    dst_idx: Tile | None = None,
    mask: Any = None,
    **_: Any,
) -> None:
    """dst = data with the first occurrence of each of the 8 vals of each partition replaced
    by imm; dst_idx (optional) receives their flattened positions."""
    what = "nisa.nc_match_replace8"
    data, vals = on_chip_operand(data, what), on_chip_operand(vals, what)
    _per_partition(data, what)
    _eight(vals, what)
    if dst.shape[0] != data.shape[0] or ops.free_size(dst.shape) != ops.free_size(data.shape):
        raise NkiError(f"{what}: dst {dst.shape} does not hold data {data.shape}")
    if dst_idx is not None and (
        dst_idx.shape[0] != data.shape[0] or ops.free_size(dst_idx.shape) != TOP
    ):
        raise NkiError(f"{what}: dst_idx must hold 8 indices per partition, got {dst_idx.shape}")
    where = _input_mask(mask, data, what)
    rows = data.shape[0]
    imm = np.float32(imm)
    shapes = (dst.shape, None if dst_idx is None else dst_idx.shape)

    def body(x: Any, v: Any, *keep: Any) -> Any:
        flat = np.array(x, np.float32).reshape(rows, -1)
        v = np.asarray(v, np.float32).reshape(rows, TOP)
        usable = np.asarray(keep[0]).reshape(rows, -1) if keep else np.ones(flat.shape, bool)
        index = np.empty((rows, TOP), np.int64)
        for p in range(rows):
            index[p] = _find(v[p], flat[p], ~usable[p], range(TOP - 1, -1, -1))
            hit = index[p][index[p] >= 0]
            flat[p, hit] = imm
        replaced = flat.reshape(shapes[0])
        if shapes[1] is None:
            return replaced
        found = np.where(index < 0, 0xFFFFFFFF, index).astype(np.float64)
        return replaced, found.reshape(shapes[1])

    ins: list[Any] = [data, vals] if where is None else [data, vals, where]
    outs = [(dst, None, "set")] + ([] if dst_idx is None else [(dst_idx, None, "set")])
    interpreter.execute(body, ins, outs, "vector", ops.free_size(data.shape))


@nc_match_replace8.legacy
def _nc_match_replace8_legacy(
    *,
    data: Tile,
    vals: Tile,
    imm: float,
    dst_idx: Tile | None = None,
    mask: Any = None,
    dtype: Any = None,
    **_: Any,
) -> Tile:
    data = on_chip_operand(data, "nisa.nc_match_replace8")
    out = ndarray(data.shape, dtype or data.dtype)
    nc_match_replace8.into(out, data, vals, imm, dst_idx=dst_idx, mask=mask)
    return out


@instruction("vector")
def tensor_copy_predicated(
    dst: Tile, src: Any, predicate: Tile, reverse_pred: bool = False, mask: Any = None, **_: Any
) -> None:
    """dst = src where predicate is nonzero (zero, with reverse_pred); dst unchanged elsewhere.
    src may be a scalar."""
    what = "nisa.tensor_copy_predicated"
    predicate = on_chip_operand(predicate, what)
    src = interpreter.operand(src)
    if isinstance(src, Tile):
        ops.compute(src, what)
        if src.buffer.name == "psum" and predicate.buffer.name == "psum":
            raise NkiError(f"{what}: src and predicate cannot both be in PSUM")
        if src.shape[0] != dst.shape[0] or ops.free_size(src.shape) != ops.free_size(dst.shape):
            raise NkiError(f"{what}: src {src.shape} and dst {dst.shape} differ in size")
    if predicate.shape[0] != dst.shape[0] or ops.free_size(predicate.shape) != ops.free_size(
        dst.shape
    ):
        raise NkiError(f"{what}: predicate {predicate.shape} and dst {dst.shape} differ in size")
    if dtypes.is_float(predicate.dtype):
        raise NkiError(
            f"{what}: the predicate is uint8, uint16 or uint32, got {dtypes.name(predicate.dtype)}"
        )
    shape = dst.shape

    def body(old: Any, value: Any, pred: Any) -> Any:
        chosen = np.asarray(pred).reshape(shape) != 0
        if reverse_pred:
            chosen = ~chosen
        value = np.asarray(value, np.float32)
        value = value.reshape(shape) if value.size == np.prod(shape) else value
        return np.where(chosen, value, np.asarray(old, np.float32))

    interpreter.execute(
        body, [dst, src, predicate], [(dst, mask, "set")], "vector", ops.free_size(shape)
    )


@tensor_copy_predicated.legacy
def _tensor_copy_predicated_legacy(
    *,
    src: Any,
    dst: Tile,
    predicate: Tile,
    reverse_pred: bool = False,
    mask: Any = None,
    **_: Any,
) -> None:
    tensor_copy_predicated.into(dst, src, predicate, reverse_pred=reverse_pred, mask=mask)
