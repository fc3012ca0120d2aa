"""How a row program addresses memory: operands as rows x free elements of the arrays in a
pointer table (HBM arrays first, filled per call; scratch arrays after, fixed at build)."""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .interpreter import Launch, Ref
from .tiles import resolve_keys


@dataclass(frozen=True)
class View:
    """An operand as rows x free elements of one array of the pointer table."""

    sid: int  # the storage (a local buffer replaces a scratch tile used by one run only)
    slot: int  # index in the pointer table
    offset: int  # elements from the array's start
    row_stride: int
    col_stride: int
    rows: int
    free: int


def rows_view(view: np.ndarray, base: np.ndarray, sid: int, slot: int) -> View | None:
    if view.ndim == 0 or view.dtype != np.float32:
        return None
    rows = view.shape[0]
    free_shape, free_strides = view.shape[1:], view.strides[1:]
    free = int(np.prod(free_shape, dtype=np.int64))
    col = 0
    dims = [(n, s) for n, s in zip(free_shape, free_strides, strict=True) if n != 1]
    for k in range(len(dims) - 1):  # free dims must flatten to one stride
        if dims[k][1] != dims[k + 1][1] * dims[k + 1][0]:
            return None
    if dims:
        col = dims[-1][1] // 4
    offset = (view.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // 4
    row_stride = view.strides[0] // 4 if rows > 1 else 0
    return View(sid, slot, offset, row_stride, col, rows, free)


class Tables:
    """The pointer table: HBM arrays first (filled per call), then scratch arrays (fixed)."""

    def __init__(self, launch: Launch, slot_of: dict[int, np.ndarray], n_hbm: int) -> None:
        self.launch = launch
        self.slot_of = slot_of
        self.n_hbm = n_hbm
        self.scratch: dict[int, int] = {}  # id(slot array) -> table index
        self.scratch_arrays: list[np.ndarray] = []
        self.templates: dict[int, np.ndarray] = {}  # sid -> stand-in with the HBM layout

    def view(self, ref: Ref, outputs_offset: int) -> tuple[View | None, np.ndarray]:
        role, index = self.launch.roles[ref.sid]
        if role == "scratch":
            base = self.slot_of[ref.sid]
            key = id(base)
            if key not in self.scratch:
                self.scratch[key] = self.n_hbm + len(self.scratch_arrays)
                self.scratch_arrays.append(base)
            slot = self.scratch[key]
        else:
            template = self.templates.get(ref.sid)
            if template is None:
                template = _layout_of(self.launch.arrays[ref.sid])
                self.templates[ref.sid] = template
            if template is None:  # negative strides: not addressed by row programs
                return None, resolve_keys(self.launch.arrays[ref.sid], ref.keys)
            base = template
            slot = index if role == "input" else outputs_offset + index
        view = resolve_keys(base, ref.keys)
        if ref.adv is not None:
            return None, view
        return rows_view(view, base, ref.sid, slot), view


def pointer(v: View, row: str) -> str:
    """A placeholder for the row's address: the run decides at the end whether the storage
    lives in memory (table array, offset, row stride) or in a row-local buffer."""
    return f"@P{v.sid},{v.slot},{v.offset},{v.row_stride},{row}@"


POINTER = re.compile(r"@P(\d+),(\d+),(-?\d+),(-?\d+),([^@]+)@")


def _layout_of(array: np.ndarray) -> np.ndarray | None:
    """An array with `array`'s shape and strides over a one-element buffer (never read or
    written: only view offsets are taken from it). The kernel cache keys on strides, so
    every call of a compiled program has this layout."""
    if any(stride < 0 for stride in array.strides):
        return None
    return np.lib.stride_tricks.as_strided(
        np.empty(1, array.dtype), array.shape, array.strides, writeable=False
    )
