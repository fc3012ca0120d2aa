"""``nisa`` Tensor Engine instructions: nc_matmul and nc_transpose."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import dtypes, interpreter, ops
from .chip_profile import GEMM_MOVING_FMAX, GEMM_STATIONARY_FMAX, PARTITIONS, target_name
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
    perf_mode: Any = "none",
    mask: Any = None,
    **_: Any,
) -> None:
    """dst (PSUM, float32) = stationary.T @ moving: accumulate=False overwrites, True adds to
    dst, None (NKI's default) overwrites each location at its first write and adds after.
    is_transpose=True is the Tensor engine's transpose mode (moving is an identity matrix, so
    dst is stationary.T, in dst's dtype): the same product, written without accumulating.
    perf_mode="double_row": see _double_row_into."""
    if _perf_mode(perf_mode) == "double_row":
        _double_row_into(dst, stationary, moving, accumulate, mask, is_transpose, tile_size)
        return
    accumulate = False if is_transpose else accumulate
    ops.matmul_into(dst, stationary, moving, accumulate, mask, "nisa.nc_matmul", is_transpose)


_WHAT = "nisa.nc_matmul(perf_mode='double_row')"


def _perf_mode(value: Any) -> str:
    """'none' or 'double_row' from the enum, its value, None, or the older API's spelling
    'double_row_gen3' (aws-neuron-sdk nki/test/test_nki_isa_nc_matmul.py)."""
    name = "none" if value is None else getattr(value, "value", value)
    if name in ("double_row", "double_row_gen3"):
        return "double_row"
    if name != "none":
        raise NkiError(f"nisa.nc_matmul: perf_mode {value!r} is not one of none, double_row")
    return "none"


def _double_row_into(
    dst: Tile,
    stationary: Tile,
    moving: Tile,
    accumulate: Any,
    mask: Any,
    is_transpose: bool,
    tile_size: Any,
) -> None:
    """The FP8 double-row mode (NeuronCore-v3 and newer, AWS's Trainium2 architecture guide,
    "Double FP8"): stationary [K, 2, M] and moving [K, 2, N] split a 2K contraction into the
    partition dimension and a most-major free dimension of 2, so dst[M, N] = sum over k and
    l of stationary[k, l, :] x moving[k, l, :], at the cycles of a K-row product. Refused with
    transpose mode or column tiling, as the hardware refuses them."""
    target = target_name()
    if target == "trn1":
        raise NkiError(f"{_WHAT} needs NeuronCore-v3 or newer (trn2, trn3); the target is trn1")
    if is_transpose:
        raise NkiError(f"{_WHAT} cannot be combined with transpose mode")
    if tile_size and tuple(tile_size)[1:] not in ((), (PARTITIONS,)):
        raise NkiError(f"{_WHAT} cannot be combined with column tiling (tile_size {tile_size})")
    stationary, moving = on_chip_operand(stationary, _WHAT), on_chip_operand(moving, _WHAT)
    for name, t in (("stationary", stationary), ("moving", moving)):
        if t.buffer.name != "sbuf":
            raise NkiError(f"{_WHAT}: the {name} operand must be an SBUF tile")
        if len(t.shape) != 3 or t.shape[1] != 2:
            raise NkiError(
                f"{_WHAT}: the {name} operand must be [K, 2, free] (the contraction split over "
                f"partitions and a dimension of 2; pad an odd contraction with zeros), got "
                f"{t.shape}"
            )
        if not dtypes.name(t.dtype).startswith("float8"):
            raise NkiError(f"{_WHAT} takes float8 operands, got {dtypes.name(t.dtype)}")
    k, _, m = stationary.shape
    k2, _, n = moving.shape
    if k != k2 or k > PARTITIONS or m > GEMM_STATIONARY_FMAX or n > GEMM_MOVING_FMAX:
        raise NkiError(
            f"{_WHAT}: stationary {stationary.shape} and moving {moving.shape} need one K of at "
            f"most {PARTITIONS}, M at most {GEMM_STATIONARY_FMAX} and N at most "
            f"{GEMM_MOVING_FMAX}"
        )
    ops.check_psum_dst(dst, (m, n), _WHAT)
    mode = "acc_after_first" if accumulate is None else "acc" if accumulate else "set"
    interpreter.current().usage.matmul_flops["fp8_double_row"] += 2 * 2 * k * m * n
    interpreter.execute(double_row_fn, [stationary, moving], [(dst, mask, mode)], "tensor", n + 64)


def double_row_fn(stationary: np.ndarray, moving: np.ndarray) -> np.ndarray:
    # [K, 2, M] and [K, 2, N] as [2K, M] and [2K, N]: the same product as ops.matmul_fn's
    k, _, m = stationary.shape
    return ops.matmul_fn(
        np.ascontiguousarray(stationary).reshape(2 * k, m),
        np.ascontiguousarray(moving).reshape(2 * k, -1),
    )


@nc_matmul.legacy
def _nc_matmul_legacy(
    stationary: Tile,
    moving: Tile,
    *,
    is_transpose: bool = False,
    perf_mode: Any = "none",
    mask: Any = None,
    **_: Any,
) -> Tile:
    # The legacy generation places instruction results itself: a PSUM result used as an
    # operand (AWS's flash-attention backward passes nc_transpose's tile) is moved to SBUF
    # first, as its compiler and simulator do; here that is an explicit Vector-engine copy.
    stationary, moving = (_in_sbuf(t) for t in (stationary, moving))
    if _perf_mode(perf_mode) == "double_row":
        out = ndarray((stationary.shape[-1], moving.shape[-1]), dtypes.float32, buffer=psum)
        nc_matmul.into(out, stationary, moving, perf_mode="double_row", mask=mask)
        return out
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
