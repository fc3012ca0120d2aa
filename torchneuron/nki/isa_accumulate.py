"""``nisa`` instructions that use the Vector Engine's accumulator registers:
``tensor_scalar_cumulative`` (a running reduction), ``select_reduce`` and ``range_select``
(selects with a running maximum).

The registers hold one value per partition and are shared by these instructions (AWS,
``nki.isa``: "The accumulator registers are shared across Vector Engine accumulation
instructions"); ``reduce_cmd`` says what an instruction does with them: ``reset_reduce``
starts from the reduction's identity, ``reduce`` continues from what they hold,
``load_reduce`` starts from ``imm1``, ``idle`` leaves them alone. The interpreter keeps them
on the launch, per partition, across instructions, in program order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import interpreter, ops
from .chip_profile import target_name
from .errors import NkiError
from .instruction import instruction, on_chip_operand
from .language import ndarray
from .tiles import Tile

_IDENTITY = {"add": 0.0, "subtract": 0.0, "multiply": 1.0, "maximum": -np.inf, "minimum": np.inf}
FP32_MIN = float(np.finfo(np.float32).min)


def _command(reduce_cmd: Any) -> str:
    name = getattr(reduce_cmd, "name", reduce_cmd)
    if name not in ("idle", "reset", "reduce", "reset_reduce", "load_reduce"):
        raise NkiError(f"reduce_cmd {reduce_cmd!r}: use a nisa.reduce_cmd value")
    return str(name)


def _registers(partitions: int) -> np.ndarray:
    """The accumulator registers of the first `partitions` partitions (NaN until set)."""
    launch = interpreter.current()
    held = launch.vector_accumulator
    if held is None or held.shape[0] < partitions:
        grown = np.full(max(partitions, 128), np.nan, np.float32)
        if held is not None:
            grown[: held.shape[0]] = held
        launch.vector_accumulator = held = grown
    return held


def _start(command: str, op: str, partitions: int, load: Any = None) -> np.ndarray:
    """The accumulator value an instruction starts from, per partition."""
    if command in ("reset", "reset_reduce"):
        return np.full(partitions, _IDENTITY[op], np.float32)
    if command == "load_reduce":
        if load is None:
            raise NkiError("reduce_cmd=load_reduce takes its start value from imm1")
        return np.broadcast_to(np.asarray(load, np.float32).reshape(-1), (partitions,)).copy()
    return _registers(partitions)[:partitions].copy()


def _scalar_or_column(value: Any, partitions: int, what: str) -> Any:
    """A compile-time scalar, or a [partitions, 1] tile (one value per partition)."""
    value = interpreter.operand(value)
    if isinstance(value, Tile):
        ops.compute(value, what)
        if value.shape[0] != partitions or ops.free_size(value.shape) != 1:
            raise NkiError(f"{what}: a tile operand is [{partitions}, 1], got {value.shape}")
    return value


def _column(value: Any) -> np.ndarray:
    return np.asarray(value, np.float32).reshape(-1, 1) if np.ndim(value) else np.float32(value)


@instruction("vector")
def tensor_scalar_cumulative(
    dst: Tile,
    src: Tile,
    op0: Any,
    op1: Any,
    imm0: Any,
    imm1: Any = None,
    reduce_cmd: Any = "reset_reduce",
    reverse0: bool = False,
    mask: Any = None,
    **_: Any,
) -> None:
    """Per partition, along its free elements: reg = op1(op0(src[i], imm0), reg), dst[i] = reg
    (op0's operands swapped with reverse0); reg starts as reduce_cmd says and is left in the
    accumulator."""
    what = "nisa.tensor_scalar_cumulative"
    src = on_chip_operand(src, what)
    first, second = ops.op_name(op0), ops.op_name(op1)
    if second not in _IDENTITY:
        raise NkiError(f"{what}: op1 is add, subtract, multiply, maximum or minimum, not {second}")
    if src.shape[0] != dst.shape[0] or ops.free_size(src.shape) != ops.free_size(dst.shape):
        raise NkiError(f"{what}: src {src.shape} and dst {dst.shape} differ in size")
    command = _command(reduce_cmd)
    rows = src.shape[0]
    imm0 = _scalar_or_column(imm0, rows, f"{what} imm0")
    imm1 = _scalar_or_column(imm1, rows, f"{what} imm1") if imm1 is not None else None
    apply, combine = ops.BINARY[first], ops.BINARY[second]
    shape = dst.shape

    def body(x: Any, scalar: Any, load: Any) -> Any:
        x = np.asarray(x, np.float32).reshape(rows, -1)
        scalar = _column(scalar)
        values = apply(scalar, x) if reverse0 else apply(x, scalar)
        reg = _start(command, second, rows, load)
        out = np.empty_like(values, dtype=np.float32)
        for i in range(values.shape[1]):
            reg = combine(values[:, i], reg).astype(np.float32)
            out[:, i] = reg
        _registers(rows)[:rows] = reg
        return out.reshape(shape)

    interpreter.execute(
        body, [src, imm0, imm1], [(dst, mask, "set")], "vector", ops.free_size(shape)
    )


def _select_and_reduce(
    what: str,
    selected: Any,
    shape: tuple[int, ...],
    reduce_res: Tile | None,
    command: str,
    reduce_op: Any,
) -> Any:
    """The body's tail shared by select_reduce and range_select: the running maximum."""
    if ops.op_name(reduce_op) not in ("maximum", "max", "amax"):
        raise NkiError(f"{what}: reduce_op supports the maximum only")
    rows = shape[0]
    flat = selected.reshape(rows, -1)
    if command != "idle":
        reg = np.maximum(_start(command, "maximum", rows), flat.max(axis=1))
        _registers(rows)[:rows] = reg
    if reduce_res is None:
        return selected.reshape(shape)
    return selected.reshape(shape), _registers(rows)[:rows].reshape(rows, 1).copy()


def _select_outputs(dst: Tile, mask: Any, reduce_res: Tile | None) -> list[Any]:
    """The writes of select_reduce and range_select: dst, and reduce_res when given."""
    return [(dst, mask, "set")] + ([] if reduce_res is None else [(reduce_res, None, "set")])


def _reduce_res(reduce_res: Tile | None, rows: int, what: str) -> None:
    if reduce_res is not None and (reduce_res.shape[0] != rows or reduce_res.shape[1:] != (1,)):
        raise NkiError(f"{what}: reduce_res must be [{rows}, 1], got {reduce_res.shape}")


@instruction("vector")
def select_reduce(
    dst: Tile,
    predicate: Tile,
    on_true: Tile,
    on_false: Any,
    reduce_res: Tile | None = None,
    reduce_cmd: Any = "idle",
    reduce_op: Any = "maximum",
    reverse_pred: bool = False,
    mask: Any = None,
    **_: Any,
) -> None:
    """dst = on_true where predicate (inverted with reverse_pred), else on_false (a scalar or
    a [P, 1] tile); with a reduce_cmd other than idle, the accumulator takes the running
    maximum of dst per partition, written to reduce_res when given."""
    what = "nisa.select_reduce"
    predicate, on_true = on_chip_operand(predicate, what), on_chip_operand(on_true, what)
    if predicate.buffer.name == "psum" and on_true.buffer.name == "psum":
        raise NkiError(f"{what}: on_true and predicate cannot both be in PSUM")
    if predicate.shape != on_true.shape or ops.free_size(dst.shape) != ops.free_size(on_true.shape):
        raise NkiError(
            f"{what}: predicate {predicate.shape}, on_true {on_true.shape} and dst {dst.shape} "
            "must have the same shape"
        )
    rows = on_true.shape[0]
    on_false = _scalar_or_column(on_false, rows, f"{what} on_false")
    _reduce_res(reduce_res, rows, what)
    command = _command(reduce_cmd)
    shape = dst.shape

    def body(pred: Any, x: Any, other: Any) -> Any:
        chosen = np.asarray(pred).reshape(rows, -1) != 0
        if reverse_pred:
            chosen = ~chosen
        selected = np.where(chosen, np.asarray(x, np.float32).reshape(rows, -1), _column(other))
        return _select_and_reduce(what, selected, shape, reduce_res, command, reduce_op)

    outs = _select_outputs(dst, mask, reduce_res)
    interpreter.execute(body, [predicate, on_true, on_false], outs, "vector", ops.free_size(shape))


_COMPARISONS = ("equal", "less", "less_equal", "greater", "greater_equal")


@instruction("vector")
def range_select(
    dst: Tile,
    on_true_tile: Tile,
    comp_op0: Any,
    comp_op1: Any,
    bound0: Tile,
    bound1: Tile,
    reduce_cmd: Any = "reset_reduce",
    reduce_res: Tile | None = None,
    reduce_op: Any = "maximum",
    range_start: int = 0,
    on_false_value: float = FP32_MIN,
    mask: Any = None,
    **_: Any,
) -> None:
    """dst = on_true_tile where comp_op0(i, bound0) and comp_op1(i, bound1) hold for the
    element's free index i + range_start (compared in float32), else on_false_value (FP32_MIN:
    the hardware's only fill); with a reduce_cmd other than idle, the running maximum per
    partition. NeuronCore-v3 and newer."""
    what = "nisa.range_select"
    if target_name() == "trn1":
        raise NkiError(f"{what} is available on NeuronCore-v3 (trn2) and newer; the target is trn1")
    on_true_tile = on_chip_operand(on_true_tile, what)
    rows = on_true_tile.shape[0]
    bounds = [_scalar_or_column(b, rows, f"{what} bound") for b in (bound0, bound1)]
    if not all(isinstance(b, Tile) for b in bounds):
        raise NkiError(f"{what}: bound0 and bound1 are [{rows}, 1] tiles")
    names = [ops.op_name(op) for op in (comp_op0, comp_op1)]
    if any(n not in _COMPARISONS for n in names):
        raise NkiError(f"{what}: comparisons are {', '.join(_COMPARISONS)}; got {names}")
    if np.float32(on_false_value) != np.float32(FP32_MIN):
        raise NkiError(f"{what}: on_false_value must be FP32_MIN ({FP32_MIN}), the hardware's fill")
    if ops.free_size(dst.shape) != ops.free_size(on_true_tile.shape) or dst.shape[0] != rows:
        raise NkiError(f"{what}: dst {dst.shape} and on_true_tile {on_true_tile.shape} differ")
    _reduce_res(reduce_res, rows, what)
    command = _command(reduce_cmd)
    first, second = (ops.BINARY[n] for n in names)
    shape = dst.shape
    start = int(range_start)

    def body(x: Any, low: Any, high: Any) -> Any:
        x = np.asarray(x, np.float32).reshape(rows, -1)
        index = (start + np.arange(x.shape[1], dtype=np.float32))[None, :]
        keep = first(index, _column(low)) & second(index, _column(high))
        selected = np.where(keep, x, np.float32(FP32_MIN))
        return _select_and_reduce(what, selected, shape, reduce_res, command, reduce_op)

    outs = _select_outputs(dst, mask, reduce_res)
    interpreter.execute(body, [on_true_tile, *bounds], outs, "vector", ops.free_size(shape))


@range_select.legacy
def _range_select_legacy(
    *,
    on_true_tile: Tile,
    comp_op0: Any,
    comp_op1: Any,
    bound0: Tile,
    bound1: Tile,
    reduce_cmd: Any = "idle",
    reduce_res: Tile | None = None,
    reduce_op: Any = "maximum",
    range_start: int = 0,
    on_false_value: float = FP32_MIN,
    mask: Any = None,
    dtype: Any = None,
    **_: Any,
) -> Tile:
    on_true_tile = on_chip_operand(on_true_tile, "nisa.range_select")
    out = ndarray(on_true_tile.shape, dtype or on_true_tile.dtype)
    range_select.into(
        out, on_true_tile, comp_op0, comp_op1, bound0, bound1, reduce_cmd=reduce_cmd,
        reduce_res=reduce_res, reduce_op=reduce_op, range_start=range_start,
        on_false_value=on_false_value, mask=mask,
    )  # fmt: skip
    return out
