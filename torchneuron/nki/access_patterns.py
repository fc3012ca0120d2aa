"""``tensor.ap(pattern, offset, scalar_offset=...)``: NKI's hardware access patterns.

An access pattern reads a tensor as the hardware does: the tensor flattened, a start offset
in elements, then one ``[step, num]`` pair per dimension, outermost first (AWS, "NKI Access
Patterns"). On SBUF/PSUM the first pair is the partition dimension and must step by the
tile's whole free size (every partition reads the same pattern). ``scalar_offset`` (a
register, a device scalar or a 1x1 tensor) moves the start by that many steps of
``indirect_dim`` at run time; ``vector_offset`` (one row index per partition) makes a gather or
scatter view of an HBM tensor (indirect_dma.py). The result is a view: instructions read and
write through it.

The compiled path does not lower access patterns: a launch that uses one is traced again on
each call (as a launch whose control flow reads device values), at the interpreter's speed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dtypes, interpreter
from .chip_profile import PARTITIONS
from .control_flow import scalar_value_of
from .errors import NkiError, NkiUnsupportedError
from .indirect_dma import VectorIndirectView, vector_indirect_view
from .tiles import Tile


def access_pattern(
    tile: Tile,
    pattern: Any,
    offset: int | None = None,
    scalar_offset: Any = None,
    vector_offset: Any = None,
    indirect_dim: int = 0,
    dtype: Any = None,
    **_: Any,
) -> Tile | VectorIndirectView:
    what = "tensor.ap"
    if vector_offset is not None and scalar_offset is not None:
        raise NkiError(f"{what}: vector_offset and scalar_offset are mutually exclusive")
    if dtype is not None and dtypes.canonical(dtype) != tile.dtype:
        raise NkiUnsupportedError(f"{what}(dtype=...) reinterpreting {tile.dtype} is not supported")
    if tile.adv is not None:
        raise NkiError(f"{what}: take the pattern on the tensor, not on an indexed access")
    base = tile.storage.array
    if not base.flags.c_contiguous:
        raise NkiUnsupportedError(f"{what} on a non-contiguous tensor (a strided view)")
    pairs = [tuple(int(v) for v in pair) for pair in pattern]
    if not pairs or any(len(p) != 2 or p[1] < 1 for p in pairs):
        raise NkiError(f"{what}: pattern must be [[step, num], ...] with num >= 1, got {pattern}")
    steps = [p[0] for p in pairs]
    shape = tuple(p[1] for p in pairs)
    itemsize = base.itemsize
    if offset is None:  # the current view's start
        offset = tile.region.__array_interface__["data"][0] - base.__array_interface__["data"][0]
        offset //= itemsize
    start = int(offset)
    if vector_offset is not None:
        return vector_indirect_view(tile, pairs, start, vector_offset, indirect_dim, what)
    if scalar_offset is not None:
        if not 0 <= indirect_dim < len(pairs):
            raise NkiError(
                f"{what}: indirect_dim {indirect_dim} outside the pattern's {len(pairs)}"
            )
        start += scalar_value_of(scalar_offset, f"{what}(scalar_offset=...)") * steps[indirect_dim]
    if tile.buffer.on_chip:
        free = int(np.prod(base.shape[1:], dtype=np.int64))
        if steps[0] != free:
            raise NkiError(
                f"{what}: on {tile.buffer.name} the first pair is the partition dimension and "
                f"must step by the tile's free size {free} (every partition reads the same "
                f"pattern), got step {steps[0]}"
            )
        if shape[0] > PARTITIONS:
            raise NkiError(f"{what}: {shape[0]} partitions exceed the NeuronCore's {PARTITIONS}")
    reach = [(n - 1) * s for n, s in zip(shape, steps, strict=True)]
    first = start + sum(r for r in reach if r < 0)
    last = start + sum(r for r in reach if r > 0)
    if first < 0 or last >= base.size:
        raise IndexError(
            f"{what}: the pattern {pairs} from element {start} reaches outside the tensor's "
            f"{base.size} elements"
        )
    flat = base.reshape(-1)
    view = np.lib.stride_tricks.as_strided(
        flat[start:], shape=shape, strides=tuple(s * itemsize for s in steps)
    )
    interpreter.current().uses_access_patterns = True
    return Tile(tile.storage, (("ap", start, shape, tuple(steps)),), view, par_axis=0)
