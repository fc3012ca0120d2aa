"""Affine index expressions: ``nl.arange``, ``nl.mgrid``, ``nl.ds`` and index normalisation.

An NKI index expression is an affine function of iteration variables; tiles indexed with
them gather (read) or scatter (write) like numpy's advanced indexing, with the expressions
broadcasting to the access's shape. The simulator represents an expression by the integer
array of its values (``nl.arange(128)[:, None]`` is a 128x1 array), so arithmetic,
comparisons (masks) and broadcasting are numpy's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import NkiError


def arange(*args: int) -> np.ndarray:
    """Index expression 0..n-1 (or start..stop by step), to be shaped with [:, None]."""
    return np.arange(*args, dtype=np.int64)


class _IndexGrid(tuple):
    """What ``nl.mgrid[...]`` returns: one expression per axis, also as .p/.x/.y/.z."""

    @property
    def p(self) -> np.ndarray:
        return self[0]

    @property
    def x(self) -> np.ndarray:
        return self[1]

    @property
    def y(self) -> np.ndarray:
        return self[2]

    @property
    def z(self) -> np.ndarray:
        return self[3]


class _MGrid:
    """``nl.mgrid[0:128, 0:512]``: open-grid index expressions (they broadcast as mgrid's)."""

    def __getitem__(self, key: Any) -> _IndexGrid:
        if not isinstance(key, tuple):
            key = (key,)
        return _IndexGrid(np.ogrid[key])


mgrid = _MGrid()


class DynSlice:
    """``nl.ds(start, size)``: `size` elements from `start` (start may depend on a loop)."""

    __slots__ = ("start", "size", "step")

    def __init__(self, start: Any, size: int, step: int = 1) -> None:
        self.start = int(start)
        self.size = int(size)
        self.step = int(step)

    def as_slice(self) -> slice:
        return slice(self.start, self.start + self.size * self.step, self.step)


def ds(start: Any, size: int, step: int = 1) -> DynSlice:
    return DynSlice(start, size, step)


def is_index_array(item: Any) -> bool:
    return isinstance(item, np.ndarray) and item.ndim > 0


def normalize_key(key: Any, shape: tuple[int, ...]) -> tuple[tuple[Any, ...], bool]:
    """The key as a tuple numpy accepts, bounds-checked for basic parts; and whether it
    holds index arrays (advanced indexing)."""
    if not isinstance(key, tuple):
        key = (key,)
    items: list[Any] = []
    advanced = False
    for item in key:
        if isinstance(item, DynSlice):
            item = item.as_slice()
        elif isinstance(item, (list, range)):
            item = np.asarray(item, dtype=np.int64)
        elif isinstance(item, (np.integer, np.ndarray)) and np.ndim(item) == 0:
            item = int(item)
        if is_index_array(item):
            if item.dtype.kind not in "iu":
                raise NkiError(f"index expressions must be integers, got dtype {item.dtype}")
            advanced = True
        items.append(item)
    ellipses = [n for n, i in enumerate(items) if i is Ellipsis]
    if len(ellipses) > 1:
        raise NkiError("an index may hold at most one '...'")
    if ellipses:
        at = ellipses[0]
        items[at : at + 1] = [slice(None)] * (len(shape) - (len(items) - 1))
    if len(items) > len(shape):
        raise NkiError(f"too many indices ({len(items)}) for a tensor of rank {len(shape)}")
    beyond = []  # slices reaching past the end of their axis
    for axis, item in enumerate(items):
        size = shape[axis]
        if isinstance(item, int):
            if not -size <= item < size:
                raise IndexError(f"index {item} is out of bounds for axis {axis} of size {size}")
        elif isinstance(item, slice):
            start, stop, step = item.start, item.stop, item.step
            if (step or 1) <= 0:
                raise NkiError("tile slices need a positive step")
            if (start is not None and start < 0) or (stop is not None and stop < 0):
                raise IndexError(
                    f"slice {start}:{stop} is out of bounds for axis {axis} of size {size}"
                )
            if (start or 0) > size or (stop is not None and stop > size):
                beyond.append(axis)
    if beyond:
        if advanced or not all(isinstance(i, slice) for i in items):
            axis = beyond[0]
            raise IndexError(
                f"slice {items[axis].start}:{items[axis].stop} is out of bounds for axis {axis} "
                f"of size {shape[axis]}"
            )
        # A tile of slices reaching past the tensor's end (the last tile of a size that is no
        # multiple of the tile): index expressions, which an access may use only under a
        # mask= that keeps it inside (as on the hardware), and which fail without one.
        rank = len(items)
        items = [
            np.arange(*item.indices(max(item.stop or shape[n], shape[n]))).reshape(
                [-1 if m == n else 1 for m in range(rank)]
            )
            for n, item in enumerate(items)
        ]
        advanced = True
    return tuple(items), advanced


def advanced_shape(view_shape: tuple[int, ...], key: tuple[Any, ...]) -> tuple[int, ...]:
    """Shape of `view[key]` for an advanced key, without reading anything."""
    probe = np.lib.stride_tricks.as_strided(
        np.zeros(1, np.int8), view_shape, (0,) * len(view_shape)
    )
    return probe[key].shape


def clipped_key(view_shape: tuple[int, ...], key: tuple[Any, ...]) -> tuple[tuple[Any, ...], bool]:
    """The key with index arrays clipped into bounds, and whether any index was outside
    (such an access is valid only where a mask predicate excludes the outside indices)."""
    out_of_bounds = False
    result: list[Any] = []
    for axis, item in enumerate(key):
        if is_index_array(item):
            size = view_shape[axis]
            if item.size and (item.min() < 0 or item.max() >= size):
                out_of_bounds = True
                item = np.clip(item, 0, size - 1)
        result.append(item)
    return tuple(result), out_of_bounds


def as_basic(key: tuple[Any, ...], view_shape: tuple[int, ...]) -> tuple[Any, ...] | None:
    """The same access as slices when every index expression is an in-bounds arithmetic
    progression along its own axis (``i0 + nl.arange(128)[:, None]``), else None. A
    rectangular affine access is then a numpy view instead of a gather."""
    arrays = [k for k in key if is_index_array(k)]
    rank = len(key)
    if len(arrays) != rank or any(a.ndim != rank for a in arrays):
        return None
    slices: list[Any] = []
    for axis, array in enumerate(arrays):
        if any(d != 1 for n, d in enumerate(array.shape) if n != axis):
            return None
        values = array.reshape(-1)
        start = int(values[0])
        step = int(values[1] - values[0]) if values.size > 1 else 1
        stop = start + step * values.size
        if step < 1 or start < 0 or stop - step >= view_shape[axis]:
            return None
        if values.size > 1 and not np.array_equal(values, np.arange(start, stop, step)):
            return None
        slices.append(slice(start, stop, step))
    return tuple(slices)
