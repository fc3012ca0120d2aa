"""Buffers, storages and tiles: the objects an NKI kernel computes with.

A *storage* is one allocation in a buffer (HBM, SBUF or PSUM) holding a numpy array. A
*tile* is an access to a storage: a chain of basic indexing steps (a numpy view) and at most
one advanced (affine-expression) index on top. Tiles are what ``nl``/``nisa`` take and
return; every read and write of tile data goes through :mod:`.interpreter`, which checks, runs
and (when tracing) records it.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from . import dtypes
from .chip_profile import PARTITIONS
from .errors import NkiError, NkiUnsupportedError
from .indexing import advanced_shape, as_basic, clipped_key, normalize_key


class Buffer:
    """A memory of the NeuronCore: on chip (SBUF, PSUM) or device memory (HBM)."""

    def __init__(
        self,
        name: str,
        on_chip: bool,
        *,
        base: int | None = None,
        physical_blocks: int | None = None,
        direct: bool = False,
    ) -> None:
        self.name = name
        self.on_chip = on_chip
        # Direct allocation (nki.compiler): the kernel places the tile itself, at `base` (an
        # SBUF byte address or a PSUM bank; None when a function places each block), its
        # block dimensions sharing `physical_blocks` physical tiles.
        self.direct = direct
        self.base = base
        self.physical_blocks = physical_blocks

    def __repr__(self) -> str:
        return f"nl.{self.name}"


sbuf = Buffer("sbuf", True)
psum = Buffer("psum", True)
hbm = Buffer("hbm", False)
shared_hbm = Buffer("shared_hbm", False)
private_hbm = Buffer("private_hbm", False)


class par_dim(int):  # noqa: N801  (NKI's name)
    """Marks the partition dimension inside a tile shape: ``(4, nl.par_dim(128), 512)``."""


_ids = itertools.count()


class Storage:
    """One allocation. `role` says where its array comes from at run time (for the
    compiled path): ("input", i), ("output", i) or ("scratch", i)."""

    __slots__ = ("array", "buffer", "dtype", "par_axis", "sid", "role", "fresh", "__weakref__")

    def __init__(self, array: np.ndarray, buffer: Buffer, dtype: Any, par_axis: int) -> None:
        self.array = array
        self.buffer = buffer
        self.dtype = dtype
        self.par_axis = par_axis
        self.sid = next(_ids)
        self.role: tuple[str, int] | None = None
        self.fresh: np.ndarray | None = None  # elements not yet written (PSUM; interpreter)

    def bytes_per_partition(self) -> int:
        shape = self.array.shape
        count = int(np.prod(shape, dtype=np.int64)) // max(shape[self.par_axis], 1) if shape else 1
        return count * dtypes.itemsize(self.dtype)


def split_shape(shape: Any) -> tuple[tuple[int, ...], int]:
    """A tile shape as ints and the index of its partition dimension."""
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    dims = tuple(shape)
    marked = [n for n, d in enumerate(dims) if isinstance(d, par_dim)]
    if len(marked) > 1:
        raise NkiError("a tile shape may mark one partition dimension (nl.par_dim)")
    ints = tuple(int(d) for d in dims)
    if any(d < 0 for d in ints):
        raise NkiError(f"tile shape {ints} has a negative dimension")
    return ints, (marked[0] if marked else 0)


class Tile:
    """A tile or tensor as kernels see it (``.shape``, ``.dtype``, indexing, operators)."""

    __slots__ = (
        "storage",
        "keys",
        "region",
        "adv",
        "adv_safe",
        "adv_oob",
        "shape",
        "par_axis",
        "write_mask",
    )

    def __init__(
        self,
        storage: Storage,
        keys: tuple[Any, ...] = (),
        region: np.ndarray | None = None,
        adv: tuple[Any, ...] | None = None,
        par_axis: int | None = None,
    ) -> None:
        self.storage = storage
        self.keys = keys
        self.region = storage.array if region is None else region
        self.adv = adv
        self.adv_safe: tuple[Any, ...] | None = None
        self.adv_oob = False
        # The mask= of the instruction that produced this tile (legacy form): assigned into a
        # tile, it writes only where the mask held, as the instruction would have written
        # into that tile directly (interpreter.assign).
        self.write_mask: Any = None
        if adv is not None:
            self.adv_safe, self.adv_oob = clipped_key(self.region.shape, adv)
            self.shape = advanced_shape(self.region.shape, self.adv_safe)
            self.par_axis = 0
        else:
            self.shape = tuple(self.region.shape)
            self.par_axis = storage.par_axis if par_axis is None else par_axis

    # -- what kernels read ---------------------------------------------------------------
    @property
    def dtype(self) -> Any:
        return self.storage.dtype

    @property
    def buffer(self) -> Buffer:
        return self.storage.buffer

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"Tile(shape={self.shape}, dtype={dtypes.name(self.dtype)}, buffer={self.buffer})"

    def __bool__(self) -> bool:
        if not self.buffer.on_chip and self.adv is None:
            # a tensor in device memory is an object, not a value: ``if out_tensor:`` (an
            # optional argument's presence) is true, as in AWS's tracer
            return True
        raise NkiError(
            "a tile's values are not known while the kernel is traced: control flow cannot "
            "depend on them (use mask=, nl.where or nisa.affine_select)"
        )

    def __iter__(self) -> Any:
        raise NkiError("tiles cannot be iterated; index them with nl.arange/nl.ds or slices")

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise NkiError("a tile is not an array while the kernel is traced; load/store it")

    def __getitem__(self, key: Any) -> Any:
        items = key if isinstance(key, tuple) else (key,)
        if any(isinstance(k, Tile) for k in items):
            return IndirectAccess(self, items)
        extra = len(items) - len(self.shape)
        if (
            extra > 0
            and self.adv is None
            and Ellipsis not in items
            and all(_unit_index(k) for k in items[len(self.shape) :])
        ):
            # A column taken with an integer (``acc[:, i]``, a (128,) tile) indexed as the
            # (128, 1) tile the hardware addresses (``col[:, 0]``): trailing unit dimensions.
            unit = (Ellipsis,) + (None,) * extra
            view = self.region[unit]
            widened = Tile(self.storage, self.keys + (unit,), view, par_axis=self.par_axis)
            return widened[items]
        if self.adv is not None:
            raise NkiUnsupportedError("indexing a tile that was already indexed by expressions")
        items, advanced = normalize_key(key, self.shape)
        if advanced:
            basic = as_basic(items, self.shape)
            if basic is None:
                return Tile(self.storage, self.keys, self.region, adv=items)
            items = basic
        view = self.region[items]
        if not isinstance(view, np.ndarray):  # every axis taken by an integer: numpy copies
            items = (*items, Ellipsis)  # the element as a 0-d view instead (replayed as is)
            view = self.region[items]
        # Integer indices before the partition axis (block dimensions) remove it from view.
        dropped = sum(1 for i in items[: self.par_axis] if isinstance(i, int))
        return Tile(self.storage, self.keys + (items,), view, par_axis=self.par_axis - dropped)

    def same_access(self, other: Tile) -> bool:
        return (
            self.storage is other.storage
            and self.region.shape == other.region.shape
            and self.region.strides == other.region.strides
            and self.region.__array_interface__["data"][0]
            == other.region.__array_interface__["data"][0]
            and self.adv is None
            and other.adv is None
        )

    # Operators, ``t[k] = v`` and ``t += v`` are installed by language.py: they are
    # instructions, run by the interpreter, which imports this module; so are the view
    # methods (``reshape``, ``permute``, ...: tensor_views.py).


def resolve_keys(array: np.ndarray, keys: tuple[Any, ...]) -> np.ndarray:
    """Replays a tile's chain of basic indexing steps on `array` (the compiled path's way
    to find the same view in this call's arrays)."""
    for key in keys:
        if isinstance(key, tuple) and len(key) == 2 and key[0] == "reshape":
            array = array.reshape(key[1])
        else:
            array = array[key]
    return array


def check_partition(shape: tuple[int, ...], par_axis: int, what: str) -> None:
    if shape and shape[par_axis] > PARTITIONS:
        raise NkiError(
            f"{what}: partition dimension size {shape[par_axis]} exceeds the NeuronCore's "
            f"{PARTITIONS} partitions (tile shape {shape}); tile the data so that "
            f"dimension {par_axis} is at most {PARTITIONS}"
        )


def _unit_index(k: Any) -> bool:
    """An index that selects the one element of a unit dimension: 0, or a slice from 0 to 1."""
    if isinstance(k, (int, np.integer)) and not isinstance(k, bool):
        return int(k) == 0
    return (
        isinstance(k, slice)
        and k.start in (None, 0)
        and k.stop in (None, 1)
        and k.step
        in (
            None,
            1,
        )
    )


class IndirectAccess:
    """An HBM tensor indexed by a tile of indices computed on the device
    (``table[b, idx_tile, nl.arange(c)[None, :]]``): a gather that ``nl.load`` performs with
    the index values the tile holds when the DMA runs."""

    def __init__(self, tensor: Tile, key: tuple[Any, ...]) -> None:
        if tensor.buffer.on_chip or tensor.adv is not None:
            raise NkiUnsupportedError(
                "indexing by a tile of indices (an indirect DMA) reads an HBM tensor or a view "
                "of it by slices"
            )
        if len(key) != len(tensor.shape):
            raise NkiError(
                f"an indirect access names every dimension: {len(key)} indices for a tensor "
                f"of rank {len(tensor.shape)}"
            )
        self.tensor = tensor
        self.key = key
        self.index_tiles = [k for k in key if isinstance(k, Tile)]
        shapes = [np.shape(k) if not isinstance(k, Tile) else k.shape for k in key]
        try:
            self.shape = tuple(np.broadcast_shapes(*shapes))
        except ValueError:
            raise NkiError(f"indirect access: index shapes {shapes} do not broadcast") from None
        self.dtype = tensor.dtype
        self.buffer = tensor.buffer

    def gather_fn(self) -> Any:
        """The gather as a function of (data, *index values): the elements the access names,
        indices clipped into range (rows a mask drops may hold any index; the hardware reads
        nothing for them). It holds no tile, so a recorded step keeps no SBUF alive."""
        pattern = tuple(None if isinstance(k, Tile) else k for k in self.key)
        shape = self.shape

        def gather(data: np.ndarray, *index_values: np.ndarray) -> np.ndarray:
            values = iter(index_values)
            key = []
            for axis, k in enumerate(pattern):
                if k is None:
                    k = np.clip(np.asarray(next(values)).astype(np.int64), 0, data.shape[axis] - 1)
                key.append(k)
            return np.broadcast_to(data[tuple(key)], shape)

        return gather
