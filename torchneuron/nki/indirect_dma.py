"""Per-partition indirect DMA: ``tensor.ap(pattern, vector_offset=idx, indirect_dim=0)`` and
``tensor.vector_select(0, idx)``, NKI's gather and scatter.

An indirect view names an HBM tensor through an access pattern whose partition dimension is
replaced, partition by partition, by a row index the kernel computed on the device: element
``(p, i1, i2, ...)`` is at ``offset + idx[p] * step0 + i1 * step1 + ...`` of the flattened
tensor (AWS, ``nisa.dma_copy``, "Indirect addressing"). ``nisa.dma_copy`` (and ``nl.load`` /
``nl.store``) read it as a gather and write it as a scatter; with ``dst_rmw_op=nl.add`` a
scatter adds into the rows, repeated rows adding up. The index values are read when the DMA
runs. A partition whose row reaches outside the tensor raises (``oob_mode.error``, the
default) or moves nothing (``oob_mode.skip``).

The view is resolved, at the DMA, into an ordinary tile with one index array of flat
addresses, so the interpreter's reads and writes (and their masks) do the moving. Launches
that use it are traced on each call, as every access pattern is (access_patterns.py).

The legacy form, an HBM tensor indexed by a tile of indices (``t[idx_tile, i_f]``, a
``tiles.IndirectAccess``), is a gather in ``nisa.dma_copy`` and a scatter in ``nisa.dma_copy``
and ``nl.store``, with the same ``oob_mode`` rules; its index values are inputs of the
recorded step, so the compiled path replays it with each call's indices. An index outside
raises numpy's message with the flat element index, as AWS's simulator does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import interpreter, ops
from .chip_profile import PARTITIONS
from .errors import NkiError, NkiUnsupportedError
from .tiles import IndirectAccess, Tile


@dataclass
class VectorIndirectView:
    """An HBM tensor seen through an access pattern with a per-partition row index."""

    tensor: Tile  # the whole HBM tensor the pattern addresses
    start: int  # element offset of the pattern
    steps: tuple[int, ...]  # per dimension, in elements; steps[0] is the indexed row's
    shape: tuple[int, ...]  # (partitions, ...)
    index: Tile  # (partitions, 1) on chip: one row index per partition

    @property
    def dtype(self) -> Any:
        return self.tensor.dtype

    @property
    def buffer(self) -> Any:
        return self.tensor.buffer

    def is_indirect(self) -> bool:
        return True

    def __getitem__(self, key: Any) -> Any:
        raise NkiError(
            "an indirect view cannot be sliced further: the dimension it indexes is "
            "resolved when the DMA runs (take the pattern you need in the .ap() call)"
        )


def vector_indirect_view(
    tensor: Tile,
    pattern: list[tuple[int, int]],
    start: int,
    index: Any,
    indirect_dim: int,
    what: str,
) -> VectorIndirectView:
    if tensor.buffer.on_chip:
        raise NkiError(
            f"{what}(vector_offset=...): the tensor indexed must be in HBM, not "
            f"{tensor.buffer.name} (a gather reads HBM rows into partitions; a scatter writes "
            "them back)"
        )
    if indirect_dim != 0:
        raise NkiUnsupportedError(
            f"{what}(vector_offset=...) with indirect_dim={indirect_dim}: the per-partition "
            "index replaces the pattern's first (partition) dimension, indirect_dim=0"
        )
    if not isinstance(index, Tile) or not index.buffer.on_chip:
        raise NkiError(
            f"{what}: vector_offset must be an SBUF tile of shape (partitions, 1) holding one "
            f"row index per partition, got {index!r}"
        )
    partitions = pattern[0][1]
    if partitions > PARTITIONS:
        raise NkiError(f"{what}: {partitions} partitions exceed the NeuronCore's {PARTITIONS}")
    count = int(np.prod(index.shape, dtype=np.int64))
    if index.shape[0] != partitions or count != partitions:
        raise NkiError(
            f"{what}: vector_offset of shape {index.shape} for a pattern of {partitions} "
            f"partitions: it must be ({partitions}, 1), one row index per partition"
        )
    interpreter.current().uses_access_patterns = True
    return VectorIndirectView(
        tensor,
        start,
        tuple(step for step, _ in pattern),
        tuple(num for _, num in pattern),
        index,
    )


def vector_select(tensor: Tile, dim: int, vector_offset: Any) -> VectorIndirectView:
    """``tensor.vector_select(0, idx)``: partition p reads row ``idx[p]`` of an HBM tensor,
    every other dimension whole (shape ``(partitions, *tensor.shape[1:])``)."""
    what = "tensor.vector_select"
    if dim != 0:
        raise NkiError(f"{what}: dim must be 0 (the row each partition selects), got {dim}")
    if tensor.adv is not None or not tensor.region.flags.c_contiguous:
        raise NkiUnsupportedError(f"{what} on an indexed or strided view of a tensor")
    partitions = vector_offset.shape[0] if isinstance(vector_offset, Tile) else 0
    inner = [int(s) for s in tensor.shape[1:]]
    row = int(np.prod(inner, dtype=np.int64))
    pattern = [(row, partitions)]
    stride = row
    for size in inner:
        stride //= size
        pattern.append((stride, size))
    base = tensor.storage.array
    start = tensor.region.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    return vector_indirect_view(tensor, pattern, start // base.itemsize, vector_offset, 0, what)


def resolve(view: VectorIndirectView, oob_skip: bool, what: str) -> tuple[Tile, np.ndarray]:
    """The view as a tile of flat addresses into its tensor (index values read now), and the
    mask of the elements whose partition's row lies inside the tensor (oob_mode.skip); a row
    outside raises unless skipped."""
    rows = interpreter.read(view.index, False).reshape(-1)
    if not np.all(np.isfinite(rows)):
        raise NkiError(f"{what}: a vector_offset index is not a finite number")
    rows = rows.astype(np.int64)
    base = view.tensor.storage.array
    size = base.size
    inner = np.zeros((1,) * len(view.shape), dtype=np.int64)
    for axis, (step, num) in enumerate(zip(view.steps[1:], view.shape[1:], strict=True), 1):
        shape = [1] * len(view.shape)
        shape[axis] = num
        inner = inner + (np.arange(num, dtype=np.int64) * step).reshape(shape)
    row_start = view.start + rows * view.steps[0]
    first = row_start + int(inner.min())
    last = row_start + int(inner.max())
    inside = (first >= 0) & (last < size)
    if not oob_skip and not inside.all():
        p = int(np.flatnonzero(~inside)[0])
        raise IndexError(
            f"{what}: partition {p}'s row index {int(rows[p])} reaches outside the tensor "
            f"(elements {int(first[p])}..{int(last[p])} of {size}); pass "
            "oob_mode=nisa.oob_mode.skip to move nothing for such partitions"
        )
    row_start = np.where(inside, row_start, 0)
    addresses = row_start.reshape((-1,) + (1,) * (len(view.shape) - 1)) + inner
    if not inside.all():  # skipped rows: any in-bounds address, masked off
        addresses = np.where(inside.reshape((-1,) + (1,) * (len(view.shape) - 1)), addresses, 0)
    flat = base.reshape(-1)
    tile = Tile(view.tensor.storage, view.tensor.keys + (("indirect",),), flat, adv=(addresses,))
    mask = np.broadcast_to(inside.reshape((-1,) + (1,) * (len(view.shape) - 1)), view.shape)
    return tile, mask


def addition_rounds(view: VectorIndirectView, tile: Tile, mask: np.ndarray) -> list[np.ndarray]:
    """Masks splitting a scatter-add into rounds that address distinct elements (a round's
    repeated element would keep only one of its additions): the k-th round holds each
    partition whose row occurred k times among the earlier partitions. Rows that can overlap
    without being equal (a pattern wider than its row step) go one partition a round."""
    addresses = tile.adv[0].reshape(tile.adv[0].shape[0], -1)
    valid = mask.reshape(mask.shape[0], -1)[:, 0]
    shape = (-1,) + (1,) * (mask.ndim - 1)
    span = int(addresses[0].max() - addresses[0].min()) + 1
    if span > abs(view.steps[0]):
        return [mask & (np.arange(len(valid)) == p).reshape(shape) for p in np.flatnonzero(valid)]
    seen: dict[int, int] = {}
    occurrence = np.zeros(len(valid), dtype=np.int64)
    for p, row in enumerate(addresses[:, 0].tolist()):
        if valid[p]:
            occurrence[p] = seen.get(row, 0)
            seen[row] = int(occurrence[p]) + 1
    rounds = int(occurrence.max(initial=0)) + 1
    return [mask & (occurrence == k).reshape(shape) for k in range(rounds)]


def copy(dst: Any, src: Any, mask: Any, oob_skip: bool, add: bool, what: str) -> None:
    """One DMA whose source (a gather) or destination (a scatter) is an indirect view."""
    gather, scatter = isinstance(src, VectorIndirectView), isinstance(dst, VectorIndirectView)
    if gather and scatter:
        raise NkiError(f"{what}: at most one side of a DMA is indirect (gather or scatter)")
    other = dst if gather else src
    if not isinstance(other, Tile):
        raise NkiError(f"{what}: the other side of an indirect DMA is a tensor or tile")
    view = src if gather else dst
    if int(np.prod(other.shape, dtype=np.int64)) != int(np.prod(view.shape, dtype=np.int64)):
        raise NkiError(f"DMA shapes differ: source {src.shape}, destination {dst.shape}")
    if mask is not None:
        raise NkiUnsupportedError(f"{what}: mask= with an indirect view (use oob_mode)")
    tile, inside = resolve(view, oob_skip, what)
    nbytes = int(np.prod(view.shape, dtype=np.int64)) * other.dtype.itemsize
    launch = interpreter.current()
    launch.usage.dma_bytes += nbytes
    launch.usage.hbm_bytes += nbytes
    reshape = _reshaper(other.shape if gather else view.shape)
    if gather:
        written = inside.reshape(other.shape) if other.shape != view.shape else inside
        mode = "acc" if add else "set"
        interpreter.execute(reshape, [tile], [(other, written, mode)], "dma", nbytes)
    elif add:
        for round_mask in addition_rounds(view, tile, inside):
            interpreter.execute(reshape, [other], [(tile, round_mask, "acc")], "dma", nbytes)
    else:
        interpreter.execute(reshape, [other], [(tile, inside, "set")], "dma", nbytes)


def _reshaper(shape: tuple[int, ...]) -> Any:
    def reshape(x: np.ndarray) -> np.ndarray:
        return np.reshape(x, shape)

    return reshape


# -- the legacy form: an HBM tensor indexed by a tile of indices -----------------------------
def _index_key(access: IndirectAccess, index_values: tuple[np.ndarray, ...]) -> tuple[Any, ...]:
    values = iter(index_values)
    return tuple(
        np.asarray(next(values)).astype(np.int64) if isinstance(k, Tile) else k for k in access.key
    )


def _outside(key: tuple[Any, ...], shape: tuple[int, ...]) -> np.ndarray:
    """Per element of the access (broadcast), whether an index falls outside its axis."""
    arrays = np.broadcast_arrays(*(np.asarray(k) for k in key))
    bad = np.zeros(arrays[0].shape, dtype=bool)
    for axis, index in enumerate(arrays):
        bad |= (index < 0) | (index >= shape[axis])
    return bad


def _raise_outside(key: tuple[Any, ...], data: np.ndarray, bad: np.ndarray) -> None:
    """The first element outside, named by its flat index as AWS's simulator names it."""
    arrays = np.broadcast_arrays(*(np.asarray(k) for k in key))
    first = np.unravel_index(int(np.flatnonzero(bad)[0]), bad.shape)
    strides = [s // data.itemsize for s in data.strides]
    flat = sum(int(a[first]) * s for a, s in zip(arrays, strides, strict=True))
    raise IndexError(f"index {flat} is out of bounds for axis 0 with size {data.size}")


def _kept_rows(bad: np.ndarray, oob_skip: bool, key: Any, data: np.ndarray) -> np.ndarray:
    """Which partitions (rows of the access) move: all, unless an index is outside; then the
    DMA raises (oob_mode.error) or those partitions move nothing (oob_mode.skip)."""
    if bad.any() and not oob_skip:
        _raise_outside(key, data, bad)
    return ~bad.reshape(bad.shape[0], -1).any(axis=1)


def legacy_copy(dst: Any, src: Any, mask: Any, oob_skip: bool, add: bool, what: str) -> None:
    """A DMA whose source (gather) or destination (scatter) is ``t[index_tile, ...]``."""
    gather = isinstance(src, IndirectAccess)
    if gather and isinstance(dst, IndirectAccess):
        raise NkiError(f"{what}: at most one side of a DMA is indirect (gather or scatter)")
    access = src if gather else dst
    other = interpreter.operand(dst if gather else src)
    if not isinstance(other, Tile):
        raise NkiError(f"{what}: the other side of an indirect DMA is a tensor or tile")
    for index in access.index_tiles:  # on chip; read when the DMA runs
        ops.compute(index, "an indirect DMA's indices")
    if any(isinstance(k, slice) for k in access.key):
        raise NkiUnsupportedError(
            f"{what}: index the other dimensions of an indirect access with nl.arange "
            "expressions, not slices"
        )
    count = int(np.prod(access.shape, dtype=np.int64))
    if int(np.prod(other.shape, dtype=np.int64)) != count:
        raise NkiError(f"DMA shapes differ: source {src.shape}, destination {dst.shape}")
    nbytes = count * access.dtype.itemsize
    launch = interpreter.current()
    launch.usage.dma_bytes += nbytes
    launch.usage.hbm_bytes += nbytes
    shape = access.shape

    if gather:
        target_shape = other.shape

        def gather_rows(data: np.ndarray, old: np.ndarray, *index_values: np.ndarray) -> Any:
            key = _index_key(access, index_values)
            bad = _outside(key, data.shape)
            keep = _kept_rows(bad, oob_skip, key, data)
            safe = tuple(
                np.clip(k, 0, n - 1) if isinstance(k, np.ndarray) else k
                for k, n in zip(key, data.shape, strict=True)
            )
            values = np.broadcast_to(data[safe], shape).reshape(target_shape)
            values = values + np.asarray(old, np.float32) if add else values
            keep = keep.reshape((-1,) + (1,) * (len(target_shape) - 1))
            return np.where(keep, values, old)

        ins = [access.tensor, other, *access.index_tiles]
        interpreter.execute(gather_rows, ins, [(other, mask, "set")], "dma", nbytes)
        return

    def scatter_rows(data: np.ndarray, value: np.ndarray, *index_values: np.ndarray) -> Any:
        key = _index_key(access, index_values)
        bad = _outside(key, data.shape)
        keep = _kept_rows(bad, oob_skip, key, data)
        arrays = np.broadcast_arrays(*(np.asarray(k) for k in key))
        rows = np.flatnonzero(keep)
        picked = tuple(a[rows] for a in arrays)
        values = np.broadcast_to(np.asarray(value, np.float32).reshape(shape), shape)[rows]
        out = np.array(data, dtype=np.float32 if data.dtype.kind == "f" else data.dtype)
        if add:
            np.add.at(out, picked, values)
        else:
            out[picked] = values
        return out

    if mask is not None:
        raise NkiUnsupportedError(f"{what}: mask= on an indirect store (use oob_mode)")
    whole = access.tensor
    ins = [whole, other, *access.index_tiles]
    interpreter.execute(scatter_rows, ins, [(whole, None, "set")], "dma", nbytes)
