"""``nisa`` Scalar and Vector Engine instructions: activation, tensor_tensor,
tensor_scalar, scalar_tensor_tensor, tensor_reduce, tensor_copy, reciprocal."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from . import dtypes, interpreter, ops
from .errors import NkiError
from .instruction import instruction, on_chip_operand
from .language import ndarray
from .tiles import Tile


# -- Scalar Engine -----------------------------------------------------------------------
def _result_tile(data: Tile, dtype: Any) -> Tile:
    """The tile a legacy (tile-returning) instruction writes: `dtype`, else the input's float
    dtype, else float32."""
    return ndarray(
        data.shape, dtype or (data.dtype if dtypes.is_float(data.dtype) else dtypes.float32)
    )


def _activation_body(
    op: str, scale_is_tile: bool, bias_is_tile: bool, reduce: str | None
) -> Callable[..., Any]:
    fn = ops.UNARY[op]
    reducer = ops.REDUCE[reduce] if reduce else None

    @ops.row_wise
    def body(x: Any, scale: Any, bias: Any) -> Any:
        rank = x.ndim
        y = ops.f32(x) * ops.pad(ops.f32(scale), rank)
        if bias is not None:
            y = y + ops.pad(ops.f32(bias), rank)
        y = fn(y)
        if reducer is None:
            return y
        return y, reducer(y, axis=tuple(range(1, y.ndim)), keepdims=True).reshape(y.shape[0], 1)

    body.lowering = ("activation", op, reduce)  # type: ignore[attr-defined]
    return body


@instruction("scalar")
def activation(
    dst: Tile,
    op: Any,
    data: Tile,
    bias: Any = None,
    scale: Any = 1.0,
    reduce_op: Any = None,
    reduce_res: Tile | None = None,
    reduce_cmd: Any = None,
    mask: Any = None,
    **_: Any,
) -> None:
    """dst = op(data * scale + bias), bias/scale per partition ([P, 1] tiles) or scalars;
    with reduce_res, also reduce_res[:, 0] = reduce_op over the free axes of the result."""
    data = on_chip_operand(data, "nisa.activation")
    name = ops.op_name(op)
    if name not in ops.UNARY:
        raise NkiError(f"nisa.activation: {name} is not an activation function")
    for label, value in (("bias", bias), ("scale", scale)):
        if isinstance(value, Tile):
            ops.compute(value, f"nisa.activation {label}")
            if value.shape not in ((data.shape[0], 1), (data.shape[0],)):
                raise NkiError(
                    f"nisa.activation: {label} must be a scalar or a [{data.shape[0]}, 1] tile "
                    f"(one value per partition), got shape {value.shape}"
                )
    if reduce_res is not None and reduce_op is None:
        reduce_op = "add"
    reduce = ops.op_name(reduce_op) if reduce_op is not None else None
    if reduce is not None and reduce not in ("add", "maximum", "minimum"):
        raise NkiError(f"nisa.activation: reduce_op must be add/maximum/minimum, got {reduce}")
    outs: list[tuple[Tile, Any, str]] = [(dst, mask, "set")]
    if reduce is not None:
        if reduce_res is None:
            raise NkiError("nisa.activation: reduce_op needs a reduce_res tile")
        if reduce_res.shape not in ((data.shape[0], 1), (data.shape[0],)):
            raise NkiError(f"nisa.activation: reduce_res must have shape [{data.shape[0]}, 1]")
        outs.append((reduce_res, None, "set"))
    body = _activation_body(name, isinstance(scale, Tile), isinstance(bias, Tile), reduce)
    scale_arg = interpreter.operand(scale)
    bias_arg = interpreter.operand(bias)
    interpreter.execute(
        body, [data, scale_arg, bias_arg], outs, "scalar", ops.free_size(data.shape)
    )


@activation.legacy
def _activation_legacy(
    op: Any,
    data: Tile,
    *,
    bias: Any = None,
    scale: Any = 1.0,
    reduce_op: Any = None,
    reduce_res: Tile | None = None,
    reduce_cmd: Any = None,
    mask: Any = None,
    dtype: Any = None,
    **_: Any,
) -> Tile:
    data = on_chip_operand(data, "nisa.activation")
    out = _result_tile(data, dtype)
    activation.into(
        out, op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res, mask=mask
    )
    return out


@instruction("scalar")
def activation_reduce(
    dst: Tile,
    op: Any,
    data: Tile,
    reduce_op: Any,
    reduce_res: Tile,
    bias: Any = None,
    scale: Any = 1.0,
    mask: Any = None,
    **_: Any,
) -> None:
    """activation with a reduction of the result along the free axes into reduce_res."""
    activation.into(
        dst, op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res, mask=mask
    )


@activation_reduce.legacy
def _activation_reduce_legacy(
    op: Any,
    data: Tile,
    *,
    reduce_op: Any,
    reduce_res: Tile,
    bias: Any = None,
    scale: Any = 1.0,
    mask: Any = None,
    dtype: Any = None,
    **_: Any,
) -> Tile:
    return _activation_legacy(
        op,
        data,
        bias=bias,
        scale=scale,
        reduce_op=reduce_op,
        reduce_res=reduce_res,
        mask=mask,
        dtype=dtype,
    )


# -- Vector Engine -----------------------------------------------------------------------
@instruction("vector")
def tensor_tensor(
    dst: Tile, data1: Tile, data2: Tile, op: Any, engine: Any = None, mask: Any = None, **_: Any
) -> None:
    """dst = op(data1, data2), elementwise (same shapes)."""
    a = on_chip_operand(data1, "nisa.tensor_tensor")
    b = on_chip_operand(data2, "nisa.tensor_tensor")
    if a.shape != b.shape:
        raise NkiError(f"nisa.tensor_tensor: operand shapes differ: {a.shape} and {b.shape}")
    name = ops.op_name(op)
    if name not in ops.BINARY:
        raise NkiError(f"nisa.tensor_tensor: {name} is not a binary operator")
    interpreter.execute(
        ops.elementwise_fn(name), [a, b], [(dst, mask, "set")], "vector", ops.free_size(a.shape)
    )


@tensor_tensor.legacy
def _tensor_tensor_legacy(
    data1: Tile,
    data2: Tile,
    op: Any,
    *,
    dtype: Any = None,
    mask: Any = None,
    engine: Any = None,
    **_: Any,
) -> Tile:
    a = on_chip_operand(data1, "nisa.tensor_tensor")
    b = on_chip_operand(data2, "nisa.tensor_tensor")
    out = ndarray(a.shape, ops.result_dtype(dtype, [a, b], ops.op_name(op)))
    tensor_tensor.into(out, a, b, op, mask=mask)
    return out


def _scalar_operand(value: Any, data: Tile, what: str) -> Any:
    value = interpreter.operand(value)
    if isinstance(value, Tile):
        ops.compute(value, what)
        if value.shape not in ((data.shape[0], 1), (data.shape[0],)):
            raise NkiError(
                f"{what}: a tensor operand must hold one value per partition "
                f"([{data.shape[0]}, 1]), got shape {value.shape}"
            )
        return value
    return np.float32(value) if isinstance(value, float) else value


@instruction("vector")
def tensor_scalar(
    dst: Tile,
    data: Tile,
    op0: Any,
    operand0: Any,
    reverse0: bool = False,
    op1: Any = None,
    operand1: Any = None,
    reverse1: bool = False,
    engine: Any = None,
    mask: Any = None,
    **_: Any,
) -> None:
    """dst = (data op0 operand0) op1 operand1; operands are scalars or [P, 1] vectors."""
    data = on_chip_operand(data, "nisa.tensor_scalar")
    first = ops.BINARY[ops.op_name(op0)]
    second = ops.BINARY[ops.op_name(op1)] if op1 is not None else None
    a0 = _scalar_operand(operand0, data, "nisa.tensor_scalar")
    a1 = _scalar_operand(operand1, data, "nisa.tensor_scalar") if op1 is not None else None

    @ops.row_wise
    def body(x: Any, s0: Any, s1: Any) -> Any:
        x = ops.f32(x)
        s0 = ops.pad(ops.f32(s0), x.ndim)
        y = first(s0, x) if reverse0 else first(x, s0)
        if second is not None:
            s1 = ops.pad(ops.f32(s1), x.ndim)
            y = second(s1, y) if reverse1 else second(y, s1)
        return y

    body.lowering = (  # type: ignore[attr-defined]
        "tensor_scalar",
        ops.op_name(op0),
        reverse0,
        ops.op_name(op1) if op1 is not None else None,
        reverse1,
    )

    interpreter.execute(
        body, [data, a0, a1], [(dst, mask, "set")], "vector", ops.free_size(data.shape)
    )


@tensor_scalar.legacy
def _tensor_scalar_legacy(
    data: Tile,
    op0: Any,
    operand0: Any,
    reverse0: bool = False,
    op1: Any = None,
    operand1: Any = None,
    reverse1: bool = False,
    *,
    dtype: Any = None,
    mask: Any = None,
    engine: Any = None,
    **_: Any,
) -> Tile:
    data = on_chip_operand(data, "nisa.tensor_scalar")
    out = _result_tile(data, dtype)
    tensor_scalar.into(out, data, op0, operand0, reverse0, op1, operand1, reverse1, mask=mask)
    return out


@instruction("vector")
def tensor_scalar_reduce(
    dst: Tile,
    data: Tile,
    op0: Any,
    operand0: Any,
    reduce_op: Any,
    reduce_res: Tile,
    reverse0: bool = False,
    mask: Any = None,
    **_: Any,
) -> None:
    """dst = data op0 operand0, and reduce_res[:, 0] = reduce_op of that over all free axes
    (one instruction on the Vector engine)."""
    what = "nisa.tensor_scalar_reduce"
    data = on_chip_operand(data, what)
    first = ops.BINARY[ops.op_name(op0)]
    reduce = ops.op_name(reduce_op)
    if reduce not in ("add", "maximum", "minimum", "multiply"):
        raise NkiError(f"{what}: reduce_op must be add, multiply, max or min, got {reduce}")
    if not isinstance(reduce_res, Tile) or reduce_res.shape not in (
        (data.shape[0], 1),
        (data.shape[0],),
    ):
        raise NkiError(f"{what}: reduce_res must be a [{data.shape[0]}, 1] tile")
    a0 = _scalar_operand(operand0, data, what)
    free_axes = tuple(range(1, len(data.shape)))
    combine = ops.REDUCE[reduce]

    def body(x: Any, s0: Any) -> Any:
        x = ops.f32(x)
        s0 = ops.pad(ops.f32(s0), x.ndim)
        y = first(s0, x) if reverse0 else first(x, s0)
        return y, combine(y, axis=free_axes).reshape(x.shape[0], 1)

    outs = [(dst, mask, "set"), (reduce_res, None, "set")]
    interpreter.execute(body, [data, a0], outs, "vector", ops.free_size(data.shape))


@tensor_scalar_reduce.legacy
def _tensor_scalar_reduce_legacy(
    data: Tile,
    op0: Any,
    operand0: Any,
    reduce_op: Any,
    reduce_res: Tile,
    reverse0: bool = False,
    *,
    dtype: Any = None,
    mask: Any = None,
    **_: Any,
) -> Tile:
    data = on_chip_operand(data, "nisa.tensor_scalar_reduce")
    out = _result_tile(data, dtype)
    tensor_scalar_reduce.into(out, data, op0, operand0, reduce_op, reduce_res, reverse0, mask=mask)
    return out


@instruction("vector")
def tensor_tensor_scan(
    dst: Tile,
    data0: Tile,
    data1: Tile,
    initial: Any,
    op0: Any,
    op1: Any,
    reverse0: bool = False,
    reverse1: bool = False,
    mask: Any = None,
    **_: Any,
) -> None:
    """A scan along the free elements of each partition (Vector engine):
    dst[:, i] = (data0[:, i] op0 dst[:, i-1]) op1 data1[:, i], with `initial` (a scalar or one
    value per partition) before the first; reverse0/1 swap each operator's operands."""
    what = "nisa.tensor_tensor_scan"
    data0, data1 = on_chip_operand(data0, what), on_chip_operand(data1, what)
    if data0.buffer.name == "psum" and data1.buffer.name == "psum":
        raise NkiError(f"{what}: data0 and data1 cannot both be in PSUM")
    if data0.shape[0] != data1.shape[0] or ops.free_size(data0.shape) != ops.free_size(data1.shape):
        raise NkiError(f"{what}: data0 {data0.shape} and data1 {data1.shape} differ in size")
    first = ops.BINARY[ops.op_name(op0)]
    second = ops.BINARY[ops.op_name(op1)]
    start = _scalar_operand(initial, data0, what)
    shape = dst.shape  # not dst: a recorded step must not keep the tile (and its SBUF) alive

    def body(a: Any, b: Any, init: Any) -> Any:
        # float32 throughout, as the engine: an integer `initial` (a numpy int64 array once
        # broadcast) would otherwise promote the whole scan to float64.
        rows = a.shape[0]
        a = np.asarray(a, np.float32).reshape(rows, -1)
        b = np.asarray(b, np.float32).reshape(rows, -1)
        init = np.asarray(init, np.float32).reshape(-1)  # a scalar, or one value a partition
        carry = np.broadcast_to(init if init.size == rows else init[:1], (rows,)).copy()
        out = np.empty_like(a)
        for i in range(a.shape[1]):
            step = first(carry, a[:, i]) if reverse0 else first(a[:, i], carry)
            carry = second(b[:, i], step) if reverse1 else second(step, b[:, i])
            out[:, i] = carry
        return out.reshape(shape)

    interpreter.execute(
        body, [data0, data1, start], [(dst, mask, "set")], "vector", ops.free_size(data0.shape)
    )


@tensor_tensor_scan.legacy
def _tensor_tensor_scan_legacy(
    data0: Tile,
    data1: Tile,
    initial: Any,
    op0: Any,
    op1: Any,
    reverse0: bool = False,
    reverse1: bool = False,
    *,
    dtype: Any = None,
    mask: Any = None,
    **_: Any,
) -> Tile:
    data0 = on_chip_operand(data0, "nisa.tensor_tensor_scan")
    out = _result_tile(data0, dtype)
    tensor_tensor_scan.into(out, data0, data1, initial, op0, op1, reverse0, reverse1, mask=mask)
    return out


@instruction("vector")
def scalar_tensor_tensor(
    dst: Tile,
    data: Tile,
    op0: Any,
    operand0: Any,
    op1: Any,
    operand1: Tile,
    reverse0: bool = False,
    reverse1: bool = False,
    mask: Any = None,
    **_: Any,
) -> None:
    """dst = (data op0 operand0) op1 operand1, operand0 a scalar/[P,1], operand1 a tile."""
    data = on_chip_operand(data, "nisa.scalar_tensor_tensor")
    other = on_chip_operand(operand1, "nisa.scalar_tensor_tensor")
    first = ops.BINARY[ops.op_name(op0)]
    second = ops.BINARY[ops.op_name(op1)]
    a0 = _scalar_operand(operand0, data, "nisa.scalar_tensor_tensor")

    @ops.row_wise
    def body(x: Any, s0: Any, y: Any) -> Any:
        x, s0, y = ops.f32(x), ops.pad(ops.f32(s0), x.ndim), ops.f32(y)
        t = first(s0, x) if reverse0 else first(x, s0)
        return second(y, t) if reverse1 else second(t, y)

    interpreter.execute(
        body, [data, a0, other], [(dst, mask, "set")], "vector", ops.free_size(data.shape)
    )


@scalar_tensor_tensor.legacy
def _scalar_tensor_tensor_legacy(
    *,
    data: Tile,
    op0: Any,
    operand0: Any,
    op1: Any,
    operand1: Tile,
    reverse0: bool = False,
    reverse1: bool = False,
    dtype: Any = None,
    mask: Any = None,
    **_: Any,
) -> Tile:
    data = on_chip_operand(data, "nisa.scalar_tensor_tensor")
    out = ndarray(data.shape, dtype or data.dtype)
    scalar_tensor_tensor.into(
        out, data, op0, operand0, op1, operand1, reverse0, reverse1, mask=mask
    )
    return out


@instruction("vector")
def tensor_reduce(
    dst: Tile,
    op: Any,
    data: Tile,
    axis: Any,
    negate: bool = False,
    keepdims: bool = False,
    mask: Any = None,
    **_: Any,
) -> None:
    """dst = op-reduction of data over free `axis` (optionally negated)."""
    data = on_chip_operand(data, "nisa.tensor_reduce")
    name = ops.op_name(op)
    if name not in ops.REDUCE:
        raise NkiError(f"nisa.tensor_reduce: {name} is not a reduction operator")
    axes = ops.reduce_axes(axis, len(data.shape), "nisa.tensor_reduce")
    shape = ops.reduced_shape(data.shape, axes, keepdims)
    if int(np.prod(dst.shape)) != int(np.prod(shape)):
        raise NkiError(
            f"nisa.tensor_reduce: dst shape {dst.shape} does not hold the result {shape}"
        )
    body = ops.reduce_fn(name, axes, keepdims, negate)
    if dst.shape != shape:
        inner = body
        target = dst.shape

        def body(x: Any) -> Any:
            return np.reshape(inner(x), target)

    interpreter.execute(body, [data], [(dst, mask, "set")], "vector", ops.free_size(data.shape))


@tensor_reduce.legacy
def _tensor_reduce_legacy(
    op: Any,
    data: Tile,
    axis: Any,
    *,
    dtype: Any = None,
    mask: Any = None,
    negate: bool = False,
    keepdims: bool = False,
    **_: Any,
) -> Tile:
    data = on_chip_operand(data, "nisa.tensor_reduce")
    axes = ops.reduce_axes(axis, len(data.shape), "nisa.tensor_reduce")
    out = ndarray(ops.reduced_shape(data.shape, axes, keepdims), dtype or data.dtype)
    tensor_reduce.into(out, op, data, axis, negate, keepdims, mask=mask)
    return out


@instruction("vector")
def tensor_copy(dst: Tile, src: Tile, engine: Any = None, mask: Any = None, **_: Any) -> None:
    """dst = src, converted to dst's dtype (PSUM→SBUF evacuation, dtype casts)."""
    src = on_chip_operand(src, "nisa.tensor_copy")
    if src.shape != dst.shape:
        raise NkiError(f"nisa.tensor_copy: shapes differ: src {src.shape}, dst {dst.shape}")
    interpreter.execute(
        interpreter._identity, [src], [(dst, mask, "set")], "vector", ops.free_size(src.shape)
    )


@tensor_copy.legacy
def _tensor_copy_legacy(
    src: Tile, *, mask: Any = None, dtype: Any = None, engine: Any = None, **_: Any
) -> Tile:
    src = on_chip_operand(src, "nisa.tensor_copy")
    out = ndarray(src.shape, dtype or src.dtype)
    tensor_copy.into(out, src, mask=mask)
    return out


@instruction("vector")
def reciprocal(dst: Tile, data: Tile, mask: Any = None, **_: Any) -> None:
    """dst = 1 / data."""
    data = on_chip_operand(data, "nisa.reciprocal")
    interpreter.execute(
        ops.elementwise_fn("reciprocal"),
        [data],
        [(dst, mask, "set")],
        "vector",
        ops.free_size(data.shape),
    )


@reciprocal.legacy
def _reciprocal_legacy(data: Tile, *, dtype: Any = None, mask: Any = None, **_: Any) -> Tile:
    data = on_chip_operand(data, "nisa.reciprocal")
    out = ndarray(data.shape, dtype or dtypes.float32)
    reciprocal.into(out, data, mask=mask)
    return out
