"""``nki.language``'s elementwise math and reductions: unary and binary functions on tiles
(Scalar/Vector engines), ``nl.where``, reductions over free axes, softmax, and the functions
NKI 0.8 composes from them (activation derivatives, magnitude comparisons, variance, RMS
norm, a gather along the free dimension). ``language.py`` re-exports them as ``nl.*``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from . import interpreter, ops
from .chip_profile import target_name
from .dtypes import float32
from .errors import NkiError
from .tiles import Tile


# -- elementwise math ------------------------------------------------------------------
def _unary(name: str) -> Callable[..., Tile]:
    def fn(x: Any, *, dtype: Any = None, mask: Any = None, **_: Any) -> Tile:
        return ops.elementwise(
            name, [x], dtype if dtype is not None else _float_dtype(x), mask, "scalar"
        )

    fn.__name__ = fn.__qualname__ = name
    fn.nki_op = name  # type: ignore[attr-defined]
    fn.__doc__ = f"Elementwise {name} (Scalar Engine)."
    return fn


def _float_dtype(x: Any) -> Any:
    from . import dtypes

    return x.dtype if isinstance(x, Tile) and dtypes.is_float(x.dtype) else float32


def _binary(name: str) -> Callable[..., Tile]:
    def fn(x: Any, y: Any, *, dtype: Any = None, mask: Any = None, **_: Any) -> Tile:
        return ops.elementwise(name, [x, y], dtype, mask)

    fn.__name__ = fn.__qualname__ = name
    fn.nki_op = name  # type: ignore[attr-defined]
    fn.__doc__ = f"Elementwise {name} of two tiles (or a tile and a scalar), Vector Engine."
    return fn


exp = _unary("exp")
log = _unary("log")
sqrt = _unary("sqrt")
rsqrt = _unary("rsqrt")
reciprocal = _unary("reciprocal")
square = _unary("square")
abs = _unary("abs")  # noqa: A001
negative = _unary("negative")
sin = _unary("sin")
cos = _unary("cos")
tan = _unary("tan")
tanh = _unary("tanh")
arctan = _unary("arctan")
sigmoid = _unary("sigmoid")
relu = _unary("relu")
gelu = _unary("gelu")
gelu_apprx_tanh = _unary("gelu_apprx_tanh")
silu = _unary("silu")
erf = _unary("erf")
sign = _unary("sign")
floor = _unary("floor")
ceil = _unary("ceil")
trunc = _unary("trunc")
invert = _unary("invert")
logical_not = _unary("logical_not")
# NKI 0.8's activation derivatives and smooth activations (also nisa.activation's op=)
gelu_apprx_sigmoid = _unary("gelu_apprx_sigmoid")
gelu_dx = _unary("gelu_dx")
gelu_apprx_sigmoid_dx = _unary("gelu_apprx_sigmoid_dx")
silu_dx = _unary("silu_dx")
erf_dx = _unary("erf_dx")
softplus = _unary("softplus")
mish = _unary("mish")

add = _binary("add")
subtract = _binary("subtract")
multiply = _binary("multiply")
divide = _binary("divide")
maximum = _binary("maximum")
minimum = _binary("minimum")
power = _binary("power")
fmod = _binary("fmod")
mod = _binary("mod")
equal = _binary("equal")
not_equal = _binary("not_equal")
greater = _binary("greater")
greater_equal = _binary("greater_equal")
less = _binary("less")
less_equal = _binary("less_equal")
logical_and = _binary("logical_and")
logical_or = _binary("logical_or")
logical_xor = _binary("logical_xor")
bitwise_and = _binary("bitwise_and")
bitwise_or = _binary("bitwise_or")
bitwise_xor = _binary("bitwise_xor")
left_shift = _binary("left_shift")
right_shift = _binary("right_shift")


def _neuroncore_v4(name: str) -> Callable[..., Tile]:
    """A binary function only NeuronCore-v4 (trn3) has: refused on an earlier target."""
    base = _binary(name)

    def fn(x: Any, y: Any, **kwargs: Any) -> Tile:
        target = target_name()
        if target != "trn3":
            raise NkiError(
                f"nl.{name} is available on NeuronCore-v4 (trn3) and newer only; the target is "
                f"{target} (NEURON_PLATFORM_TARGET_OVERRIDE)"
            )
        return base(x, y, **kwargs)

    fn.__name__ = fn.__qualname__ = name
    fn.nki_op = name  # type: ignore[attr-defined]
    fn.__doc__ = base.__doc__
    return fn


abs_max = _neuroncore_v4("abs_max")
abs_min = _neuroncore_v4("abs_min")


def where(condition: Any, x: Any, y: Any, *, dtype: Any = None, mask: Any = None, **_: Any) -> Tile:
    """Elementwise select: `x` where `condition` is true, else `y`."""
    values = [interpreter.operand(v) for v in (condition, x, y)]
    for v in values:
        ops.compute(v, "nl.where")
    shape = ops.broadcast_shapes(values, "nl.where")
    out = ops.new_tile(shape, ops.result_dtype(dtype, values[1:]))
    rank = len(shape)
    interpreter.execute(
        lambda c, a, b: np.where(
            ops.pad(np.asarray(c), rank) != 0, ops.pad(ops.f32(a), rank), ops.pad(ops.f32(b), rank)
        ),
        values,
        [(out, mask, "set")],
        "vector",
        ops.free_size(shape),
    )
    return out


# -- reductions ------------------------------------------------------------------------
_REDUCE_IDENTITY = {"add": 0.0, "maximum": -np.inf, "minimum": np.inf, "multiply": 1.0}


def _masked_reduction(
    body: Callable[..., Any], op: str, x: Tile, mask: Any, axes: tuple[int, ...], keepdims: bool
) -> tuple[Callable[..., Any], list[Any], Any]:
    """(body, inputs, output mask) of a reduction whose mask covers its input."""
    if op not in _REDUCE_IDENTITY or not ops.mask_fits(mask, x.shape):
        raise NkiError(
            f"a mask of shape {np.shape(mask)} fits neither the reduction's input {x.shape} "
            "nor its output"
        )
    where = np.broadcast_to(np.asarray(mask, dtype=bool), x.shape)
    identity = np.float32(_REDUCE_IDENTITY[op])

    def masked(v: Any, keep: Any) -> Any:
        return body(np.where(keep, v, identity))

    return masked, [x, where], where.any(axis=axes, keepdims=keepdims)


def _reduction(name: str, op: str) -> Callable[..., Tile]:
    def fn(
        x: Tile, axis: Any, *, dtype: Any = None, mask: Any = None, keepdims: bool = False, **_: Any
    ) -> Tile:
        ops.compute(x, f"nl.{name}")
        axes = ops.reduce_axes(axis, len(x.shape), f"nl.{name}")
        shape = ops.reduced_shape(x.shape, axes, keepdims)
        out = ops.new_tile(
            shape,
            dtype if dtype is not None else _float_dtype(x) if op != "bitwise_or" else x.dtype,
        )
        body = ops.reduce_fn(op, axes, keepdims)
        if name == "mean":
            count = int(np.prod([x.shape[a] for a in axes]))
            total = body

            @ops.row_wise
            def body(v: Any) -> Any:
                return total(v) / np.float32(count)

            body.lowering = ("reduce", op, axes, keepdims, False, count)  # type: ignore[attr-defined]

        ins: list[Any] = [x]
        if mask is not None and not ops.mask_fits(mask, out.shape):
            # A mask over the reduced input's iteration space (AWS's adaptive pooling masks
            # the pooling window): masked-off elements take no part, and the result is
            # written where any element of its row took part.
            body, ins, mask = _masked_reduction(body, op, x, mask, axes, keepdims)
        interpreter.execute(body, ins, [(out, mask, "set")], "vector", ops.free_size(x.shape))
        out.write_mask = mask
        return out

    fn.__name__ = fn.__qualname__ = name
    fn.nki_op = op  # type: ignore[attr-defined]
    fn.__doc__ = f"{name} over free axes `axis` (Vector Engine); axis 0 is the partition."
    return fn


sum = _reduction("sum", "add")  # noqa: A001
max = _reduction("max", "maximum")  # noqa: A001
min = _reduction("min", "minimum")  # noqa: A001
prod = _reduction("prod", "multiply")
mean = _reduction("mean", "add")


def softmax(x: Tile, axis: Any, *, dtype: Any = None, mask: Any = None, **_: Any) -> Tile:
    """Softmax over free axes."""
    ops.compute(x, "nl.softmax")
    axes = ops.reduce_axes(axis, len(x.shape), "nl.softmax")
    out = ops.new_tile(x.shape, dtype if dtype is not None else _float_dtype(x))

    @ops.row_wise
    def body(v: Any) -> Any:
        v = ops.f32(v)
        e = np.exp(v - v.max(axis=axes, keepdims=True))
        return e / e.sum(axis=axes, keepdims=True)

    body.lowering = ("softmax", axes)  # type: ignore[attr-defined]

    interpreter.execute(body, [x], [(out, mask, "set")], "scalar", 3 * ops.free_size(x.shape))
    return out


def var(x: Tile, axis: Any, *, dtype: Any = None, mask: Any = None, **_: Any) -> Tile:
    """Population variance over free axes (numpy's var); the result keeps the reduced axes
    as size 1 (NKI 0.8 ignores keepdims)."""
    ops.compute(x, "nl.var")
    axes = ops.reduce_axes(axis, len(x.shape), "nl.var")
    out = ops.new_tile(ops.reduced_shape(x.shape, axes, True), dtype or _float_dtype(x))

    @ops.row_wise
    def body(v: Any) -> Any:
        return ops.f32(v).var(axis=axes, keepdims=True)

    interpreter.execute(body, [x], [(out, mask, "set")], "vector", 2 * ops.free_size(x.shape))
    return out


def all(x: Tile, axis: Any, *, dtype: Any = None, mask: Any = None, **_: Any) -> Tile:  # noqa: A001
    """Logical AND over free axes (numpy's all): 1 where every element is nonzero."""
    ops.compute(x, "nl.all")
    axes = ops.reduce_axes(axis, len(x.shape), "nl.all")
    out = ops.new_tile(ops.reduced_shape(x.shape, axes, False), dtype or x.dtype)

    @ops.row_wise
    def body(v: Any) -> Any:
        return np.all(np.asarray(v) != 0, axis=axes)

    interpreter.execute(body, [x], [(out, mask, "set")], "vector", ops.free_size(x.shape))
    return out


def rms_norm(
    x: Tile,
    w: Any,
    axis: Any,
    n: int,
    epsilon: float = 1e-6,
    *,
    dtype: Any = None,
    compute_dtype: Any = None,
    mask: Any = None,
    **_: Any,
) -> Tile:
    """``x / sqrt(sum(x^2 over axis) / n + epsilon) * w``, computed in float32."""
    values = [interpreter.operand(v) for v in (x, w)]
    for v in values:
        ops.compute(v, "nl.rms_norm")
    axes = ops.reduce_axes(axis, len(x.shape), "nl.rms_norm")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise NkiError(f"nl.rms_norm: n (the count of values in the mean) must be >= 1, got {n}")
    shape = ops.broadcast_shapes(values, "nl.rms_norm")
    out = ops.new_tile(shape, dtype or _float_dtype(x))
    rank = len(shape)

    def body(v: Any, weight: Any) -> Any:
        v = ops.f32(v)
        mean_square = np.square(v).sum(axis=axes, keepdims=True) / np.float32(n)
        scale = 1.0 / np.sqrt(mean_square + np.float32(epsilon))
        return ops.pad(v * scale, rank) * ops.pad(ops.f32(weight), rank)

    interpreter.execute(body, values, [(out, mask, "set")], "vector", 3 * ops.free_size(shape))
    return out


def gather_flattened(
    data: Tile, indices: Tile, axis: int = 0, *, dtype: Any = None, mask: Any = None, **_: Any
) -> Tile:
    """Per partition, the elements of `data`'s flattened free dimensions at `indices`:
    ``out[p, j...] = data[p].reshape(-1)[indices[p, j...]]`` (an index outside the row
    raises)."""
    for v, what in ((data, "data"), (indices, "indices")):
        ops.compute(v, f"nl.gather_flattened ({what})")
    if axis != 0:
        raise NkiError(f"nl.gather_flattened: axis must be 0 (per partition), got {axis}")
    if data.shape[0] != indices.shape[0]:
        raise NkiError(
            f"nl.gather_flattened: data has {data.shape[0]} partitions, indices "
            f"{indices.shape[0]}: one row of indices per partition of data"
        )
    out = ops.new_tile(indices.shape, dtype or data.dtype)
    row = int(np.prod(data.shape[1:], dtype=np.int64))

    @ops.row_wise
    def body(d: Any, idx: Any) -> Any:
        flat = np.asarray(d).reshape(d.shape[0], -1)
        where = np.asarray(idx).astype(np.int64).reshape(idx.shape[0], -1)
        if where.size and (where.min() < 0 or where.max() >= row):
            raise IndexError(
                f"nl.gather_flattened: index {int(where.min() if where.min() < 0 else where.max())}"
                f" outside a row of {row} elements"
            )
        return np.take_along_axis(flat, where, axis=1).reshape(idx.shape)

    interpreter.execute(
        body, [data, indices], [(out, mask, "set")], "gpsimd", ops.free_size(indices.shape)
    )
    return out
