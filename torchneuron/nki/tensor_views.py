"""NKI 0.8's ``NkiTensor`` view methods on tiles: ``slice``, ``select``, ``expand_dim``,
``squeeze_dim``, ``reshape`` / ``reshape_dim`` / ``flatten_dims``, ``permute``,
``broadcast``, ``rearrange``, ``get_pattern`` and ``is_contiguous`` (AWS, ``nki.language``,
``NkiTensor``). Each returns a view sharing the storage; none copies.

On-chip tensors keep their partition dimension outermost and whole: a method that would
move, split, merge, broadcast or drop it is refused with the rule. Views made by basic
indexing and reshapes replay in the compiled path; ``permute`` and ``broadcast`` are strided
views the compiled path does not lower, so a launch using them is traced on each call (as
access patterns are, access_patterns.py).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import dtypes, interpreter
from .control_flow import scalar_value_of
from .errors import NkiError, NkiUnsupportedError
from .tiles import Tile, private_hbm


def _dim(tile: Tile, dim: int, what: str, new: bool = False) -> int:
    rank = len(tile.shape) + (1 if new else 0)
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or not -rank <= dim < rank:
        raise NkiError(f"{what}: dim {dim!r} is not a dimension of a rank-{rank} tensor")
    return int(dim) % rank


def _plain(tile: Tile, what: str) -> None:
    if tile.adv is not None:
        raise NkiUnsupportedError(f"{what} on a tile indexed by expressions")
    if tile.buffer.on_chip and tile.par_axis != 0:
        raise NkiUnsupportedError(
            f"{what} on a tile whose partition dimension is not dimension 0 (nl.par_dim blocks)"
        )


def _partition_kept(tile: Tile, dim: int, what: str) -> None:
    if tile.buffer.on_chip and dim == 0:
        raise NkiError(
            f"{what}: dimension 0 of an on-chip tensor is its partition dimension, which a "
            "view cannot change"
        )


def _indexed(tile: Tile, key: tuple[Any, ...]) -> Tile:
    """A basic-indexing view (slices, integers, None), replayable by the compiled path."""
    view = tile.region[key]
    return Tile(tile.storage, tile.keys + (key,), view, par_axis=0)


def slice_dim(tile: Tile, dim: int, start: int, end: int, step: int = 1) -> Tile:
    what = "tensor.slice"
    _plain(tile, what)
    dim = _dim(tile, dim, what)
    size = tile.shape[dim]
    if not (0 <= start < end <= size) or step < 1:
        raise NkiError(
            f"{what}: [{start}:{end}:{step}] on a dimension of size {size} (need 0 <= start < "
            "end <= size and step >= 1)"
        )
    return _indexed(tile, (slice(None),) * dim + (slice(int(start), int(end), int(step)),))


def select(tile: Tile, dim: int, index: Any) -> Tile:
    """Static (an int) or dynamic (a register or a one-element tile, read on the device)
    selection of one index of `dim`, removing it (on chip, dimension 0 stays, size 1)."""
    what = "tensor.select"
    _plain(tile, what)
    dim = _dim(tile, dim, what)
    dynamic = not isinstance(index, (int, np.integer))
    if dynamic and tile.buffer.on_chip and dim == 0:
        raise NkiError(f"{what}: a dynamic index cannot select an on-chip partition")
    value = scalar_value_of(index, what) if dynamic else int(index)
    if not 0 <= value < tile.shape[dim]:
        raise IndexError(f"{what}: index {value} outside dimension {dim} of size {tile.shape[dim]}")
    if tile.buffer.on_chip and dim == 0:
        return _indexed(tile, (slice(value, value + 1),))
    return _indexed(tile, (slice(None),) * dim + (value,))


def expand_dim(tile: Tile, dim: int) -> Tile:
    what = "tensor.expand_dim"
    _plain(tile, what)
    dim = _dim(tile, dim, what, new=True)
    _partition_kept(tile, dim, what)
    return _indexed(tile, (slice(None),) * dim + (None,))


def squeeze_dim(tile: Tile, dim: int) -> Tile:
    what = "tensor.squeeze_dim"
    _plain(tile, what)
    dim = _dim(tile, dim, what)
    _partition_kept(tile, dim, what)
    if tile.shape[dim] != 1:
        raise NkiError(f"{what}: dimension {dim} has size {tile.shape[dim]}, not 1")
    return _indexed(tile, (slice(None),) * dim + (0,))


def reshape(tile: Tile, shape: Any) -> Tile:
    """A view with another shape and the same elements in the same order; refused when the
    view's strides cannot give it without a copy, or (on chip) when it changes the partition
    dimension."""
    what = "tensor.reshape"
    _plain(tile, what)
    dims = tuple(int(d) for d in (shape if isinstance(shape, (tuple, list)) else (shape,)))
    if math.prod(dims) != math.prod(tile.shape) or any(d < 1 for d in dims):
        raise NkiError(f"{what}: {tile.shape} has {math.prod(tile.shape)} elements, not {dims}")
    if tile.buffer.on_chip and dims[0] != tile.shape[0]:
        raise NkiError(
            f"{what}: an on-chip tensor keeps its {tile.shape[0]} partitions as dimension 0, "
            f"got shape {dims}"
        )
    view = tile.region.view()
    try:
        view.shape = dims
    except (AttributeError, ValueError):
        raise NkiError(
            f"{what}: the view's layout (strides {tile.region.strides}) cannot be reshaped to "
            f"{dims} without copying"
        ) from None
    return Tile(tile.storage, tile.keys + (("reshape", dims),), view, par_axis=0)


def reshape_dim(tile: Tile, dim: int, shape: Any) -> Tile:
    what = "tensor.reshape_dim"
    dim = _dim(tile, dim, what)
    parts = [int(d) for d in shape]
    if parts.count(-1) > 1:
        raise NkiError(f"{what}: at most one size may be -1, got {tuple(parts)}")
    known = math.prod(d for d in parts if d != -1)
    if -1 in parts:
        if known <= 0 or tile.shape[dim] % known:
            raise NkiError(f"{what}: {tuple(parts)} does not divide size {tile.shape[dim]}")
        parts[parts.index(-1)] = tile.shape[dim] // known
    if math.prod(parts) != tile.shape[dim]:
        raise NkiError(f"{what}: {tuple(parts)} does not multiply to size {tile.shape[dim]}")
    if tile.buffer.on_chip and dim == 0 and len(parts) != 1:
        _partition_kept(tile, 0, what)
    return reshape(tile, tile.shape[:dim] + tuple(parts) + tile.shape[dim + 1 :])


def flatten_dims(tile: Tile, start_dim: int, end_dim: int) -> Tile:
    what = "tensor.flatten_dims"
    start, end = _dim(tile, start_dim, what), _dim(tile, end_dim, what)
    if start > end:
        raise NkiError(f"{what}: start_dim {start_dim} is after end_dim {end_dim}")
    _partition_kept(tile, start, what)
    merged = math.prod(tile.shape[start : end + 1])
    return reshape(tile, tile.shape[:start] + (merged,) + tile.shape[end + 1 :])


def _strided(tile: Tile, shape: tuple[int, ...], strides: tuple[int, ...]) -> Tile:
    """A view the compiled path does not replay (the launch is traced on each call)."""
    base = tile.storage.array
    start = tile.region.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    view = np.lib.stride_tricks.as_strided(tile.region, shape=shape, strides=strides)
    steps = tuple(s // base.itemsize for s in strides)
    interpreter.current().uses_access_patterns = True
    return Tile(tile.storage, (("ap", start // base.itemsize, shape, steps),), view, par_axis=0)


def permute(tile: Tile, dims: Any) -> Tile:
    what = "tensor.permute"
    _plain(tile, what)
    order = tuple(int(d) for d in dims)
    if sorted(order) != list(range(len(tile.shape))):
        raise NkiError(f"{what}: {order} is not a permutation of the {len(tile.shape)} dims")
    if tile.buffer.on_chip and order[0] != 0:
        raise NkiError(
            f"{what}: an on-chip tensor keeps its partition dimension first, got {order}"
        )
    if order == tuple(range(len(order))):
        return tile
    return _strided(
        tile,
        tuple(tile.shape[d] for d in order),
        tuple(tile.region.strides[d] for d in order),
    )


def broadcast(tile: Tile, dim: int, size: int) -> Tile:
    what = "tensor.broadcast"
    _plain(tile, what)
    dim = _dim(tile, dim, what)
    _partition_kept(tile, dim, what)
    if tile.shape[dim] != 1:
        raise NkiError(f"{what}: dimension {dim} has size {tile.shape[dim]}; only 1 broadcasts")
    if size < 1:
        raise NkiError(f"{what}: size must be >= 1, got {size}")
    shape = tile.shape[:dim] + (int(size),) + tile.shape[dim + 1 :]
    strides = tile.region.strides[:dim] + (0,) + tile.region.strides[dim + 1 :]
    return _strided(tile, shape, strides)


def rearrange(
    tile: Tile, src_pattern: Any, dst_pattern: Any, fixed_sizes: dict[str, int] | None = None
) -> Tile:
    """einops-style: split the source groups into named dimensions, reorder them, merge the
    destination groups (``(('b', ('h', 'w')), ('b', 'w', 'h'), {'h': 4})``)."""
    what = "tensor.rearrange"
    src = [g if isinstance(g, (tuple, list)) else (g,) for g in src_pattern]
    dst = [g if isinstance(g, (tuple, list)) else (g,) for g in dst_pattern]
    if len(src) != len(tile.shape):
        raise NkiError(f"{what}: {len(src)} source groups for a rank-{len(tile.shape)} tensor")
    names = [n for g in src for n in g]
    if sorted(names) != sorted(n for g in dst for n in g) or len(set(names)) != len(names):
        raise NkiError(f"{what}: {dst_pattern} does not name the dimensions of {src_pattern}")
    sizes = dict(fixed_sizes or {})
    for group, size in zip(src, tile.shape, strict=True):
        unknown = [n for n in group if n not in sizes]
        known = math.prod(sizes[n] for n in group if n in sizes)
        if len(unknown) > 1:
            raise NkiError(f"{what}: give the sizes of all but one of {group} (fixed_sizes)")
        if unknown:
            if size % known:
                raise NkiError(f"{what}: {group} of sizes {sizes} does not divide {size}")
            sizes[unknown[0]] = size // known
        elif known != size:
            raise NkiError(f"{what}: {group} multiplies to {known}, the dimension is {size}")
    split = reshape(tile, tuple(sizes[n] for n in names)) if len(names) != len(src) else tile
    order = [names.index(n) for g in dst for n in g]
    moved = permute(split, order)
    merged = tuple(math.prod(sizes[n] for n in g) for g in dst)
    return reshape(moved, merged) if len(merged) != len(order) else moved


def get_pattern(tile: Tile) -> list[list[int]]:
    """The view's ``[[stride, count], ...]`` in elements, one pair per dimension."""
    _plain(tile, "tensor.get_pattern")
    itemsize = tile.storage.array.itemsize
    return [[s // itemsize, n] for s, n in zip(tile.region.strides, tile.shape, strict=True)]


def is_contiguous(tile: Tile) -> bool:
    """Whether the view covers its storage row-major without gaps (on chip, per partition:
    dimension 0 is skipped)."""
    pattern = get_pattern(tile)
    first = 1 if tile.buffer.on_chip else 0
    expected = 1
    for stride, count in reversed(pattern[first:]):
        if count != 1 and stride != expected:
            return False
        expected *= count
    return True


def _native_bytes(values: np.ndarray, dtype: Any) -> np.ndarray:
    """The values of `dtype` as the bytes the device holds (the simulator keeps bfloat16 and
    float8 as float32 values; tfloat32 is held in 4 bytes as float32 is)."""
    if isinstance(dtype, dtypes.NamedDtype) and dtype.name != "tfloat32":
        return np.ascontiguousarray(values.astype(dtypes.host(dtype)))
    return np.ascontiguousarray(values)


def _reinterpreted(source: Any, target: Any) -> Any:
    def reinterpret(values: np.ndarray) -> np.ndarray:
        raw = _native_bytes(np.asarray(values), source)
        if isinstance(target, dtypes.NamedDtype) and target.name != "tfloat32":
            return raw.view(dtypes.host(target)).astype(np.float32)
        return raw.view(dtypes.storage(target))

    return reinterpret


def view_dtype(tile: Tile, dtype: Any) -> Tile:
    """``tensor.view(dtype)``: an HBM tensor's bytes read as `dtype`; the same element size
    keeps the shape, another scales the last dimension (contiguous, dividing evenly). The
    device reinterprets in place at no cost; here tiles hold values, not bytes, so a view of
    another type is a copy made by one DMA step of no cycles (the compiled path repeats it
    every call), and writing through it is refused rather than lost. NaN payloads of
    bfloat16 and float8 views come out canonical (values pass through float32)."""
    what = "tensor.view"
    target = dtypes.canonical(dtype)
    if target == tile.dtype:
        return tile
    if tile.buffer.on_chip:
        raise NkiUnsupportedError(
            f"{what}({dtypes.name(target)}) of an on-chip tile: reinterpreting is for HBM "
            "tensors here; convert tile values with nl.copy(tile, dtype=...)"
        )
    _plain(tile, what)
    if not tile.shape or not is_contiguous(tile):
        raise NkiError(f"{what}({dtypes.name(target)}) needs a contiguous tensor of rank >= 1")
    last = tile.shape[-1] * dtypes.itemsize(tile.dtype)
    if last % dtypes.itemsize(target):
        raise NkiError(
            f"{what}: the last dimension's {last} bytes do not divide into "
            f"{dtypes.itemsize(target)}-byte {dtypes.name(target)} elements"
        )
    shape = tile.shape[:-1] + (last // dtypes.itemsize(target),)
    launch = interpreter.current()
    out = launch.allocate(shape, target, private_hbm)
    fn = _reinterpreted(tile.dtype, target)
    interpreter.execute(fn, [tile], [(out, None, "set")], "dma", 0)
    launch.read_only[out.storage.sid] = (
        f"{what}({dtypes.name(target)}) of a {dtypes.name(tile.dtype)} tensor is read-only "
        "here (the simulator holds values, not bytes): store into the tensor itself"
    )
    return out


METHODS = {
    "view": view_dtype,
    "reshape": reshape,
    "slice": slice_dim,
    "select": select,
    "expand_dim": expand_dim,
    "squeeze_dim": squeeze_dim,
    "reshape_dim": reshape_dim,
    "flatten_dims": flatten_dims,
    "permute": permute,
    "broadcast": broadcast,
    "rearrange": rearrange,
    "get_pattern": get_pattern,
    "is_contiguous": is_contiguous,
}
