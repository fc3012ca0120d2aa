"""``nisa`` Tensor Engine instructions: nc_matmul and nc_transpose."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dtypes, interpreter, ops
from .chip_profile import PARTITIONS, target_name
from .errors import NkiError
from .instruction import instruction, on_chip_operand
from .language import copy, ndarray
from .tiles import Tile, psum, sbuf


@instruction("tensor")
def nc_matmul(
    dst: Tile,
    stationary: Tile,
    moving: Tile,
    is_stationary_onezero: bool = False,
    is_moving_onezero: bool = False,
    is_transpose: bool = False,
    accumulate: Any = None,
    tile_position: Any = (),
    tile_size: Any = (),
    mask: Any = None,
    **_: Any,
) -> None:
    """dst (PSUM, float32) = stationary.T @ moving: accumulate=False overwrites, True adds to
    dst, None (NKI's default) overwrites each location at its first write and adds after.
    is_transpose=True is the Tensor engine's transpose mode (moving is an identity matrix, so
    dst is stationary.T, in dst's dtype): the same product, written without accumulating."""
    accumulate = False if is_transpose else accumulate
    ops.matmul_into(dst, stationary, moving, accumulate, mask, "nisa.nc_matmul", is_transpose)


@nc_matmul.legacy
def _nc_matmul_legacy(
    stationary: Tile, moving: Tile, *, is_transpose: bool = False, mask: Any = None, **_: Any
) -> Tile:
    # The legacy generation places instruction results itself: a PSUM result used as an
    # operand (AWS's flash-attention backward passes nc_transpose's tile) is moved to SBUF
    # first, as its compiler and simulator do; here that is an explicit Vector-engine copy.
    stationary, moving = (_in_sbuf(t) for t in (stationary, moving))
    if is_transpose:  # transpose mode: the result keeps the input's dtype from NeuronCore-v3
        _, m, n = ops.check_matmul(stationary, moving, "nisa.nc_matmul")
        gen3 = target_name() != "trn1"
        out = ndarray((m, n), stationary.dtype if gen3 else dtypes.float32, buffer=psum)
        nc_matmul.into(out, stationary, moving, is_transpose=True, mask=mask)
        return out
    return ops.matmul_result(stationary, moving, mask, "nisa.nc_matmul")


def _in_sbuf(operand: Any) -> Any:
    if isinstance(operand, Tile) and operand.buffer.name == "psum":
        return copy(operand)
    return operand


@instruction("tensor")
def nc_transpose(dst: Tile, data: Tile, engine: Any = None, mask: Any = None, **_: Any) -> None:
    """dst = data.T (partition and free dimension swapped); Tensor Engine writes PSUM."""
    data = on_chip_operand(data, "nisa.nc_transpose")
    if len(data.shape) != 2 or data.shape[0] > PARTITIONS or data.shape[1] > PARTITIONS:
        raise NkiError(f"nisa.nc_transpose takes a 2-D tile of at most 128x128, got {data.shape}")
    if dst.shape != data.shape[::-1]:
        raise NkiError(f"nisa.nc_transpose: dst shape {dst.shape} is not {data.shape[::-1]}")
    interpreter.execute(np.transpose, [data], [(dst, mask, "set")], "tensor", data.shape[0] + 64)


@nc_transpose.legacy
def _nc_transpose_legacy(
    data: Tile, *, mask: Any = None, dtype: Any = None, engine: Any = None, **_: Any
) -> Tile:
    data = on_chip_operand(data, "nisa.nc_transpose")
    buffer = sbuf if engine is not None and getattr(engine, "name", "") == "vector" else psum
    out = ndarray(
        data.shape[::-1], dtype or (dtypes.float32 if buffer is psum else data.dtype), buffer=buffer
    )
    nc_transpose.into(out, data, mask=mask)
    return out
