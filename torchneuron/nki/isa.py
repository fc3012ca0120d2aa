"""``nki.isa`` (``nisa``): NeuronCore instructions, in both API generations.

Legacy ``neuronxcc.nki.isa`` instructions return a new tile (``nisa.nc_matmul(stationary,
moving)`` returns a PSUM tile); the newer ``nki.isa`` takes the destination first
(``nisa.nc_matmul(dst, stationary, moving, accumulate=...)``). Each function here accepts
both: a call that binds to the destination-first signature with tiles in its tile
parameters is the new form, anything else the legacy form.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from . import dtypes, ops, runtime
from .errors import NkiError, NkiUnsupportedError
from .language import dma, ndarray
from .profile import BN_STATS_FMAX, PARTITIONS
from .tiles import Tile, psum, sbuf


class engine(enum.Enum):  # noqa: N801  (NKI's names)
    unknown = 0
    tensor = 1
    vector = 2
    scalar = 3
    gpsimd = 4
    sync = 5


class reduce_cmd(enum.Enum):  # noqa: N801
    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class dge_mode(enum.Enum):  # noqa: N801
    unknown = 0
    none = 1
    swdge = 2
    hwdge = 3


class oob_mode(enum.Enum):  # noqa: N801
    error = 0
    skip = 1


class nc_version(enum.Enum):  # noqa: N801
    gen2 = 2
    gen3 = 3
    gen4 = 4


def get_nc_version() -> nc_version:
    from .profile import target_name

    return {"trn1": nc_version.gen2, "trn2": nc_version.gen3, "trn3": nc_version.gen4}[
        target_name()
    ]


_TILE_PARAMS = ("dst", "data", "data1", "data2", "src", "stationary", "moving")


def _generations(new: Callable[..., Any], legacy: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(new)

    def instruction(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return legacy(*args, **kwargs)
        named = bound.arguments
        if all(isinstance(named[p], Tile) for p in _TILE_PARAMS if p in named):
            return new(*args, **kwargs)
        return legacy(*args, **kwargs)

    instruction.__name__ = instruction.__qualname__ = new.__name__.removesuffix("_into")
    instruction.__doc__ = new.__doc__
    instruction.__wrapped__ = new  # type: ignore[attr-defined]
    return instruction


def _tensor_like(value: Any, what: str) -> Any:
    value = runtime.operand(value)
    ops.compute(value, what)
    return value


# -- Tensor Engine -----------------------------------------------------------------------
def nc_matmul_into(
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
    """dst (PSUM, float32) = stationary.T @ moving; accumulates unless accumulate=False."""
    if is_transpose:
        raise NkiUnsupportedError("nc_matmul(is_transpose=True): use nisa.nc_transpose")
    ops.matmul_into(dst, stationary, moving, accumulate is not False, mask, "nisa.nc_matmul")


def _nc_matmul_legacy(
    stationary: Tile, moving: Tile, *, is_transpose: bool = False, mask: Any = None, **_: Any
) -> Tile:
    if is_transpose:
        raise NkiUnsupportedError("nc_matmul(is_transpose=True): use nisa.nc_transpose")
    return ops.matmul_result(stationary, moving, mask, "nisa.nc_matmul")


nc_matmul = _generations(nc_matmul_into, _nc_matmul_legacy)


def nc_transpose_into(
    dst: Tile, data: Tile, engine: Any = None, mask: Any = None, **_: Any
) -> None:
    """dst = data.T (partition and free dimension swapped); Tensor Engine writes PSUM."""
    data = _tensor_like(data, "nisa.nc_transpose")
    if len(data.shape) != 2 or data.shape[0] > PARTITIONS or data.shape[1] > PARTITIONS:
        raise NkiError(f"nisa.nc_transpose takes a 2-D tile of at most 128x128, got {data.shape}")
    if dst.shape != data.shape[::-1]:
        raise NkiError(f"nisa.nc_transpose: dst shape {dst.shape} is not {data.shape[::-1]}")
    runtime.execute(np.transpose, [data], [(dst, mask, "set")], "tensor", data.shape[0] + 64)


def _nc_transpose_legacy(
    data: Tile, *, mask: Any = None, dtype: Any = None, engine: Any = None, **_: Any
) -> Tile:
    data = _tensor_like(data, "nisa.nc_transpose")
    buffer = sbuf if engine is not None and getattr(engine, "name", "") == "vector" else psum
    out = ndarray(
        data.shape[::-1], dtype or (dtypes.float32 if buffer is psum else data.dtype), buffer=buffer
    )
    nc_transpose_into(out, data, mask=mask)
    return out


nc_transpose = _generations(nc_transpose_into, _nc_transpose_legacy)


# -- Scalar Engine -----------------------------------------------------------------------
def _activation_body(
    op: str, scale_is_tile: bool, bias_is_tile: bool, reduce: str | None
) -> Callable[..., Any]:
    fn = ops.UNARY[op]
    reducer = ops.REDUCE[reduce] if reduce else None

    def body(x: Any, scale: Any, bias: Any) -> Any:
        rank = x.ndim
        y = ops.f32(x) * ops.pad(ops.f32(scale), rank)
        if bias is not None:
            y = y + ops.pad(ops.f32(bias), rank)
        y = fn(y)
        if reducer is None:
            return y
        return y, reducer(y, axis=tuple(range(1, y.ndim)), keepdims=True).reshape(y.shape[0], 1)

    return body


def activation_into(
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
    data = _tensor_like(data, "nisa.activation")
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
        if reduce_res.shape != (data.shape[0], 1):
            raise NkiError(f"nisa.activation: reduce_res must have shape [{data.shape[0]}, 1]")
        outs.append((reduce_res, None, "set"))
    body = _activation_body(name, isinstance(scale, Tile), isinstance(bias, Tile), reduce)
    scale_arg = runtime.operand(scale)
    bias_arg = runtime.operand(bias)
    runtime.execute(body, [data, scale_arg, bias_arg], outs, "scalar", ops.free_size(data.shape))


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
    data = _tensor_like(data, "nisa.activation")
    out = ndarray(
        data.shape, dtype or (data.dtype if dtypes.is_float(data.dtype) else dtypes.float32)
    )
    activation_into(
        out, op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res, mask=mask
    )
    return out


activation = _generations(activation_into, _activation_legacy)


def activation_reduce_into(
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
    activation_into(
        dst, op, data, bias=bias, scale=scale, reduce_op=reduce_op, reduce_res=reduce_res, mask=mask
    )


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


activation_reduce = _generations(activation_reduce_into, _activation_reduce_legacy)


# -- Vector Engine -----------------------------------------------------------------------
def tensor_tensor_into(
    dst: Tile, data1: Tile, data2: Tile, op: Any, engine: Any = None, mask: Any = None, **_: Any
) -> None:
    """dst = op(data1, data2), elementwise (same shapes)."""
    a = _tensor_like(data1, "nisa.tensor_tensor")
    b = _tensor_like(data2, "nisa.tensor_tensor")
    if a.shape != b.shape:
        raise NkiError(f"nisa.tensor_tensor: operand shapes differ: {a.shape} and {b.shape}")
    name = ops.op_name(op)
    if name not in ops.BINARY:
        raise NkiError(f"nisa.tensor_tensor: {name} is not a binary operator")
    runtime.execute(
        ops.elementwise_fn(name), [a, b], [(dst, mask, "set")], "vector", ops.free_size(a.shape)
    )


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
    a = _tensor_like(data1, "nisa.tensor_tensor")
    b = _tensor_like(data2, "nisa.tensor_tensor")
    out = ndarray(a.shape, ops.result_dtype(dtype, [a, b], ops.op_name(op)))
    tensor_tensor_into(out, a, b, op, mask=mask)
    return out


tensor_tensor = _generations(tensor_tensor_into, _tensor_tensor_legacy)


def _scalar_operand(value: Any, data: Tile, what: str) -> Any:
    value = runtime.operand(value)
    if isinstance(value, Tile):
        ops.compute(value, what)
        if value.shape not in ((data.shape[0], 1), (data.shape[0],)):
            raise NkiError(
                f"{what}: a tensor operand must hold one value per partition "
                f"([{data.shape[0]}, 1]), got shape {value.shape}"
            )
        return value
    return np.float32(value) if isinstance(value, float) else value


def tensor_scalar_into(
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
    data = _tensor_like(data, "nisa.tensor_scalar")
    first = ops.BINARY[ops.op_name(op0)]
    second = ops.BINARY[ops.op_name(op1)] if op1 is not None else None
    a0 = _scalar_operand(operand0, data, "nisa.tensor_scalar")
    a1 = _scalar_operand(operand1, data, "nisa.tensor_scalar") if op1 is not None else None

    def body(x: Any, s0: Any, s1: Any) -> Any:
        x = ops.f32(x)
        s0 = ops.pad(ops.f32(s0), x.ndim)
        y = first(s0, x) if reverse0 else first(x, s0)
        if second is not None:
            s1 = ops.pad(ops.f32(s1), x.ndim)
            y = second(s1, y) if reverse1 else second(y, s1)
        return y

    runtime.execute(body, [data, a0, a1], [(dst, mask, "set")], "vector", ops.free_size(data.shape))


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
    data = _tensor_like(data, "nisa.tensor_scalar")
    out = ndarray(
        data.shape, dtype or (data.dtype if dtypes.is_float(data.dtype) else dtypes.float32)
    )
    tensor_scalar_into(out, data, op0, operand0, reverse0, op1, operand1, reverse1, mask=mask)
    return out


tensor_scalar = _generations(tensor_scalar_into, _tensor_scalar_legacy)


def scalar_tensor_tensor_into(
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
    data = _tensor_like(data, "nisa.scalar_tensor_tensor")
    other = _tensor_like(operand1, "nisa.scalar_tensor_tensor")
    first = ops.BINARY[ops.op_name(op0)]
    second = ops.BINARY[ops.op_name(op1)]
    a0 = _scalar_operand(operand0, data, "nisa.scalar_tensor_tensor")

    def body(x: Any, s0: Any, y: Any) -> Any:
        x, s0, y = ops.f32(x), ops.pad(ops.f32(s0), x.ndim), ops.f32(y)
        t = first(s0, x) if reverse0 else first(x, s0)
        return second(y, t) if reverse1 else second(t, y)

    runtime.execute(
        body, [data, a0, other], [(dst, mask, "set")], "vector", ops.free_size(data.shape)
    )


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
    data = _tensor_like(data, "nisa.scalar_tensor_tensor")
    out = ndarray(data.shape, dtype or data.dtype)
    scalar_tensor_tensor_into(
        out, data, op0, operand0, op1, operand1, reverse0, reverse1, mask=mask
    )
    return out


scalar_tensor_tensor = _generations(scalar_tensor_tensor_into, _scalar_tensor_tensor_legacy)


def tensor_reduce_into(
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
    data = _tensor_like(data, "nisa.tensor_reduce")
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

    runtime.execute(body, [data], [(dst, mask, "set")], "vector", ops.free_size(data.shape))


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
    data = _tensor_like(data, "nisa.tensor_reduce")
    axes = ops.reduce_axes(axis, len(data.shape), "nisa.tensor_reduce")
    out = ndarray(ops.reduced_shape(data.shape, axes, keepdims), dtype or data.dtype)
    tensor_reduce_into(out, op, data, axis, negate, keepdims, mask=mask)
    return out


tensor_reduce = _generations(tensor_reduce_into, _tensor_reduce_legacy)


def tensor_copy_into(dst: Tile, src: Tile, engine: Any = None, mask: Any = None, **_: Any) -> None:
    """dst = src, converted to dst's dtype (PSUM→SBUF evacuation, dtype casts)."""
    src = _tensor_like(src, "nisa.tensor_copy")
    if src.shape != dst.shape:
        raise NkiError(f"nisa.tensor_copy: shapes differ: src {src.shape}, dst {dst.shape}")
    runtime.execute(
        runtime._identity, [src], [(dst, mask, "set")], "vector", ops.free_size(src.shape)
    )


def _tensor_copy_legacy(
    src: Tile, *, mask: Any = None, dtype: Any = None, engine: Any = None, **_: Any
) -> Tile:
    src = _tensor_like(src, "nisa.tensor_copy")
    out = ndarray(src.shape, dtype or src.dtype)
    tensor_copy_into(out, src, mask=mask)
    return out


tensor_copy = _generations(tensor_copy_into, _tensor_copy_legacy)


def reciprocal_into(dst: Tile, data: Tile, mask: Any = None, **_: Any) -> None:
    """dst = 1 / data."""
    data = _tensor_like(data, "nisa.reciprocal")
    runtime.execute(
        ops.elementwise_fn("reciprocal"),
        [data],
        [(dst, mask, "set")],
        "vector",
        ops.free_size(data.shape),
    )


def _reciprocal_legacy(data: Tile, *, dtype: Any = None, mask: Any = None, **_: Any) -> Tile:
    data = _tensor_like(data, "nisa.reciprocal")
    out = ndarray(data.shape, dtype or dtypes.float32)
    reciprocal_into(out, data, mask=mask)
    return out


reciprocal = _generations(reciprocal_into, _reciprocal_legacy)


# -- statistics --------------------------------------------------------------------------
# bn_stats writes, per partition and per chunk of at most 512 elements, two triples
# (count, mean, variance) for the chunk's even and odd elements; bn_aggr combines any
# number of such triples (Chan's parallel variance) into [mean, variance].
def _bn_stats_body(x: Any) -> Any:
    x = ops.f32(x).reshape(x.shape[0], -1)
    even, odd = x[:, 0::2], x[:, 1::2]
    out = np.zeros((x.shape[0], 6), np.float32)
    for n, part in enumerate((even, odd)):
        if part.shape[1]:
            out[:, 3 * n] = part.shape[1]
            out[:, 3 * n + 1] = part.mean(axis=1)
            out[:, 3 * n + 2] = part.var(axis=1)
    return out


def _bn_aggr_body(stats: Any) -> Any:
    s = ops.f32(stats).reshape(stats.shape[0], -1, 3)
    count, mean, var = s[..., 0], s[..., 1], s[..., 2]
    total = count.sum(axis=1)
    safe = np.where(total > 0, total, 1)
    grand = (count * mean).sum(axis=1) / safe
    m2 = (count * (var + (mean - grand[:, None]) ** 2)).sum(axis=1) / safe
    return np.stack([grand, m2], axis=1)


def bn_stats_into(dst: Tile, data: Tile, mask: Any = None, **_: Any) -> None:
    """Mean/variance statistics of each partition's (at most 512) elements, 6 per partition."""
    data = _tensor_like(data, "nisa.bn_stats")
    if ops.free_size(data.shape) > BN_STATS_FMAX:
        raise NkiError(
            f"nisa.bn_stats: free size {ops.free_size(data.shape)} exceeds {BN_STATS_FMAX} "
            "(nl.tile_size.bn_stats_fmax); compute stats per chunk and aggregate with bn_aggr"
        )
    if dst.shape != (data.shape[0], 6):
        raise NkiError(f"nisa.bn_stats: dst must have shape [{data.shape[0]}, 6], got {dst.shape}")
    runtime.execute(
        _bn_stats_body, [data], [(dst, mask, "set")], "vector", ops.free_size(data.shape)
    )


def _bn_stats_legacy(data: Tile, *, mask: Any = None, dtype: Any = None, **_: Any) -> Tile:
    data = _tensor_like(data, "nisa.bn_stats")
    out = ndarray((data.shape[0], 6), dtype or dtypes.float32)
    bn_stats_into(out, data, mask=mask)
    return out


bn_stats = _generations(bn_stats_into, _bn_stats_legacy)


def bn_aggr_into(dst: Tile, data: Tile, mask: Any = None, **_: Any) -> None:
    """[mean, variance] per partition from concatenated bn_stats outputs."""
    data = _tensor_like(data, "nisa.bn_aggr")
    if ops.free_size(data.shape) % 6:
        raise NkiError(
            f"nisa.bn_aggr: input free size must be a multiple of 6 (bn_stats), got {data.shape}"
        )
    if dst.shape != (data.shape[0], 2):
        raise NkiError(f"nisa.bn_aggr: dst must have shape [{data.shape[0]}, 2], got {dst.shape}")
    runtime.execute(
        _bn_aggr_body, [data], [(dst, mask, "set")], "vector", ops.free_size(data.shape)
    )


def _bn_aggr_legacy(data: Tile, *, mask: Any = None, dtype: Any = None, **_: Any) -> Tile:
    data = _tensor_like(data, "nisa.bn_aggr")
    out = ndarray((data.shape[0], 2), dtype or dtypes.float32)
    bn_aggr_into(out, data, mask=mask)
    return out


bn_aggr = _generations(bn_aggr_into, _bn_aggr_legacy)


# -- GpSimd ------------------------------------------------------------------------------
def iota_into(dst: Tile, expr: Any, mask: Any = None, **_: Any) -> None:
    """dst = the values of an index expression (e.g. nl.arange(128)[:, None] * 4)."""
    values = np.asarray(expr)
    runtime.execute(lambda: values, [], [(dst, mask, "set")], "gpsimd", ops.free_size(dst.shape))


def _iota_legacy(expr: Any, dtype: Any, *, mask: Any = None, **_: Any) -> Tile:
    out = ndarray(np.shape(expr), dtype)
    iota_into(out, expr, mask=mask)
    return out


iota = _generations(iota_into, _iota_legacy)


def memset_into(dst: Tile, value: Any, engine: Any = None, mask: Any = None, **_: Any) -> None:
    """dst[...] = value."""
    if not dst.buffer.on_chip:
        raise NkiError("nisa.memset writes SBUF/PSUM tiles")
    runtime.execute(
        lambda: np.asarray(value), [], [(dst, mask, "set")], "gpsimd", ops.free_size(dst.shape)
    )


def _memset_legacy(
    shape: Any, value: Any, dtype: Any, *, mask: Any = None, engine: Any = None, **_: Any
) -> Tile:
    out = ndarray(shape, dtype)
    memset_into(out, value, mask=mask)
    return out


memset = _generations(memset_into, _memset_legacy)


def affine_select_into(
    dst: Tile, pred: Any, on_true_tile: Tile, on_false_value: Any, mask: Any = None, **_: Any
) -> None:
    """dst = on_true_tile where the affine predicate holds, else on_false_value."""
    data = _tensor_like(on_true_tile, "nisa.affine_select")
    condition = np.asarray(pred, dtype=bool)
    fill = np.float32(on_false_value)
    runtime.execute(
        lambda x: np.where(condition, ops.f32(x), fill),
        [data],
        [(dst, mask, "set")],
        "gpsimd",
        ops.free_size(data.shape),
    )


def _affine_select_legacy(
    pred: Any,
    on_true_tile: Tile,
    on_false_value: Any,
    *,
    mask: Any = None,
    dtype: Any = None,
    **_: Any,
) -> Tile:
    data = _tensor_like(on_true_tile, "nisa.affine_select")
    out = ndarray(data.shape, dtype or data.dtype)
    affine_select_into(out, pred, data, on_false_value, mask=mask)
    return out


affine_select = _generations(affine_select_into, _affine_select_legacy)


def tensor_partition_reduce(
    op: Any, data: Tile, *, mask: Any = None, dtype: Any = None, **_: Any
) -> Tile:
    """Reduction across partitions (GpSimd): [P, F] → [1, F]."""
    data = _tensor_like(data, "nisa.tensor_partition_reduce")
    reducer = ops.REDUCE[ops.op_name(op)]
    out = ndarray((1,) + data.shape[1:], dtype or data.dtype)
    runtime.execute(
        lambda x: reducer(ops.f32(x), axis=0, keepdims=True),
        [data],
        [(out, mask, "set")],
        "gpsimd",
        ops.free_size(data.shape) * data.shape[0],
    )
    return out


# -- DMA ---------------------------------------------------------------------------------
def dma_copy(
    dst: Tile,
    src: Tile,
    mask: Any = None,
    dst_rmw_op: Any = None,
    oob_mode: Any = None,
    dge_mode: Any = None,
    **_: Any,
) -> None:
    """Copies src to dst through a DMA queue (HBM↔SBUF, or within either)."""
    if not isinstance(dst, Tile) or not isinstance(src, Tile):
        raise NkiError("nisa.dma_copy takes tensors/tiles as dst and src")
    if dst.buffer.name == "psum" or src.buffer.name == "psum":
        raise NkiError("nisa.dma_copy moves HBM/SBUF data; PSUM is read with nisa.tensor_copy")
    if dst_rmw_op is not None:
        name = ops.op_name(dst_rmw_op)
        if name != "add":
            raise NkiError("nisa.dma_copy: dst_rmw_op supports nl.add only")
        runtime.execute(
            runtime._identity, [src], [(dst, mask, "acc")], "dma", int(np.prod(dst.shape))
        )
        return
    dma(dst, src, mask)
