"""The math both ``nl`` and ``nisa`` share: operator table, operand checks, and the
elementwise / reduction / matmul instruction bodies (pure numpy functions).

Engines compute in float32 whatever the tile types, as the NeuronCore's engines do;
results are rounded to the destination tile's type when written.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from . import dtypes, interpreter
from .chip_profile import GEMM_MOVING_FMAX, GEMM_STATIONARY_FMAX, PARTITIONS
from .errors import NkiError
from .tiles import Tile, psum, sbuf


def f32(x: Any) -> Any:
    if isinstance(x, np.ndarray) and x.dtype != np.float32 and x.dtype.kind == "f":
        return x.astype(np.float32)
    return x


def _erf(x: np.ndarray) -> np.ndarray:
    # Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7, under float32's precision).
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    return np.sign(x) * (1.0 - poly * np.exp(-a * a))


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x * np.float32(1 / math.sqrt(2))))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    c = np.float32(math.sqrt(2 / math.pi))
    return 0.5 * x * (1.0 + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _rsqrt(x: np.ndarray) -> np.ndarray:
    return 1.0 / np.sqrt(x)


_TWO_OVER_SQRT_PI = np.float32(2 / math.sqrt(math.pi))
_GELU_SIGMOID = np.float32(1.702)  # x * sigmoid(1.702 x), the sigmoid GELU approximation


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(np.float32(0), x)


def _gelu_dx(x: np.ndarray) -> np.ndarray:
    """d/dx x Phi(x) = Phi(x) + x phi(x)."""
    phi = np.exp(-0.5 * x * x) * np.float32(1 / math.sqrt(2 * math.pi))
    return 0.5 * (1.0 + _erf(x * np.float32(1 / math.sqrt(2)))) + x * phi


def _gelu_sigmoid_dx(x: np.ndarray) -> np.ndarray:
    s = _sigmoid(_GELU_SIGMOID * x)
    return s + _GELU_SIGMOID * x * s * (1.0 - s)


def _silu_dx(x: np.ndarray) -> np.ndarray:
    s = _sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": _rsqrt,
    "reciprocal": np.reciprocal,
    "square": np.square,
    "abs": np.abs,
    "negative": np.negative,
    "sin": np.sin,
    "cos": np.cos,
    "tan": np.tan,
    "tanh": np.tanh,
    "arctan": np.arctan,
    "sigmoid": _sigmoid,
    "relu": lambda x: np.maximum(x, 0),
    "gelu": _gelu,
    "gelu_apprx_tanh": _gelu_tanh,
    "silu": lambda x: x * _sigmoid(x),
    "erf": _erf,
    "erf_dx": lambda x: _TWO_OVER_SQRT_PI * np.exp(-x * x),
    "gelu_dx": _gelu_dx,
    "gelu_apprx_sigmoid": lambda x: x * _sigmoid(_GELU_SIGMOID * x),
    "gelu_apprx_sigmoid_dx": _gelu_sigmoid_dx,
    "silu_dx": _silu_dx,
    "softplus": _softplus,
    "mish": lambda x: x * np.tanh(_softplus(x)),
    "sign": np.sign,
    "floor": np.floor,
    "ceil": np.ceil,
    "trunc": np.trunc,
    "copy": lambda x: x,
    "invert": np.invert,
    "logical_not": np.logical_not,
}

BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": np.divide,
    "maximum": np.maximum,
    "minimum": np.minimum,
    "power": np.power,
    "fmod": np.fmod,
    "mod": np.mod,  # the sign of the divisor, as numpy's
    "equal": np.equal,
    "not_equal": np.not_equal,
    "greater": np.greater,
    "greater_equal": np.greater_equal,
    "less": np.less,
    "less_equal": np.less_equal,
    "logical_and": np.logical_and,
    "logical_or": np.logical_or,
    "logical_xor": np.logical_xor,
    "bitwise_and": np.bitwise_and,
    "bitwise_or": np.bitwise_or,
    "bitwise_xor": np.bitwise_xor,
    "left_shift": np.left_shift,
    "right_shift": np.right_shift,
    # the input with the larger (smaller) magnitude, signed; y on a tie (NeuronCore-v4)
    "abs_max": lambda x, y: np.where(np.abs(x) > np.abs(y), x, y),
    "abs_min": lambda x, y: np.where(np.abs(x) < np.abs(y), x, y),
}

REDUCE: dict[str, Callable[..., Any]] = {
    "add": np.sum,
    "maximum": np.max,
    "minimum": np.min,
    "multiply": np.prod,
    "bitwise_and": np.bitwise_and.reduce,
    "bitwise_or": np.bitwise_or.reduce,
}

_COMPARE = {"equal", "not_equal", "greater", "greater_equal", "less", "less_equal"}


def op_name(op: Any) -> str:
    """The name of an nl operator passed as ``op=`` (nl.add, np.add, "add")."""
    name = getattr(op, "nki_op", None) or getattr(op, "__name__", None) or op
    if not isinstance(name, str):
        raise NkiError(f"{op!r} is not an NKI operator (pass e.g. nl.add or nl.exp)")
    return {"sum": "add", "max": "maximum", "min": "minimum", "mul": "multiply"}.get(name, name)


def compute(tile: Any, what: str) -> None:
    """Compute instructions read and write on-chip tiles only."""
    if isinstance(tile, Tile):
        if not tile.buffer.on_chip:
            raise NkiError(
                f"{what}: operand is in {tile.buffer.name}; compute engines read SBUF/PSUM only, "
                "load it first (nl.load / nisa.dma_copy)"
            )
        if tile.par_axis != 0:
            raise NkiError(
                f"{what}: index the block dimensions of a tile of shape {tile.shape} first"
            )
        if tile.shape and tile.shape[0] > PARTITIONS:
            raise NkiError(f"{what}: partition dimension {tile.shape[0]} exceeds {PARTITIONS}")


def row_wise(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Marks an instruction body whose every output partition row depends only on the same
    row of its tile inputs (any number of rows): the compiled path may run a loop's
    iterations as one call over their rows stacked."""
    fn.row_wise = True  # type: ignore[attr-defined]
    return fn


def constant_fn(value: Any) -> Callable[[], Any]:
    """The body of a fill (memset, nl.zeros/ones/full): the value, broadcast on write."""

    def fill() -> Any:
        return np.asarray(value)

    if np.ndim(value) == 0 and not isinstance(value, (bool, np.bool_)):
        fill.lowering = ("fill", value)  # type: ignore[attr-defined]
    return fill


def pad(x: Any, rank: int) -> Any:
    """A tile's array with trailing size-1 free dimensions up to `rank`: NKI aligns operands
    on the partition dimension (a [128] tile is one value per partition), unlike numpy."""
    if isinstance(x, np.ndarray) and 0 < x.ndim < rank:
        return x.reshape(x.shape + (1,) * (rank - x.ndim))
    if isinstance(x, np.ndarray) and x.ndim > rank >= 1 and all(d == 1 for d in x.shape[rank:]):
        # a [P, 1] per-partition operand beside a [P] data tile: the same P values
        return x.reshape(x.shape[:rank])
    return x


def mask_fits(mask: Any, shape: tuple[int, ...]) -> bool:
    """Whether a mask broadcasts to `shape` (an operand's iteration space)."""
    try:
        return np.broadcast_shapes(np.shape(mask), shape) == tuple(shape)
    except ValueError:
        return False


def broadcast_shapes(values: list[Any], what: str) -> tuple[int, ...]:
    rank = max((len(v.shape) for v in values if isinstance(v, Tile)), default=0)
    shapes = [v.shape + (1,) * (rank - len(v.shape)) for v in values if isinstance(v, Tile)]
    try:
        return tuple(np.broadcast_shapes(*shapes)) if shapes else ()
    except ValueError:
        raise NkiError(f"{what}: operand shapes {shapes} do not broadcast") from None


def free_size(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1


def new_tile(shape: tuple[int, ...], dtype: Any, buffer: Any = sbuf) -> Tile:
    return interpreter.current().allocate(shape, dtype, buffer)


def result_dtype(dtype: Any, values: list[Any], op: str | None = None) -> Any:
    if dtype is not None:
        return dtypes.canonical(dtype)
    if op in _COMPARE:
        return dtypes.float32 if any(_is_float_operand(v) for v in values) else dtypes.uint8
    tiles = [v.dtype for v in values if isinstance(v, Tile)]
    if not tiles:
        return dtypes.float32
    if any(isinstance(v, float) for v in values):
        tiles.append(dtypes.float32)
    return dtypes.result_type(*tiles)


def _is_float_operand(value: Any) -> bool:
    return isinstance(value, float) or (isinstance(value, Tile) and dtypes.is_float(value.dtype))


def elementwise_fn(op: str, rank: int = 0) -> Callable[..., Any]:
    if rank and op in BINARY:
        plain = elementwise_fn(op)

        def aligned(x: Any, y: Any) -> Any:
            return plain(pad(x, rank), pad(y, rank))

        if hasattr(plain, "ufunc"):
            aligned.aligned_ufunc = (plain.ufunc, rank)  # type: ignore[attr-defined]
        aligned.lowering = ("binary", op, True)  # type: ignore[attr-defined]
        return row_wise(aligned)
    if op in UNARY:
        base = UNARY[op]

        def unary(x: Any) -> Any:
            return base(f32(x))

        if isinstance(base, np.ufunc):
            unary.ufunc = base  # type: ignore[attr-defined]
        unary.lowering = ("unary", op)  # type: ignore[attr-defined]
        return row_wise(unary)
    base2 = BINARY[op]

    def binary(x: Any, y: Any) -> Any:
        return base2(f32(x), f32(y))

    if isinstance(base2, np.ufunc):
        binary.ufunc = base2  # type: ignore[attr-defined]
    binary.lowering = ("binary", op, False)  # type: ignore[attr-defined]
    return row_wise(binary)


def elementwise(op: str, values: list[Any], dtype: Any, mask: Any, engine: str = "vector") -> Tile:
    values = [interpreter.operand(v) for v in values]
    for v in values:
        compute(v, f"nl.{op}")
    shape = broadcast_shapes(values, f"nl.{op}")
    out = new_tile(shape, result_dtype(dtype, values, op))
    ranks = {len(v.shape) for v in values if isinstance(v, Tile)}
    fn = elementwise_fn(op, len(shape) if len(ranks) > 1 else 0)
    interpreter.execute(fn, values, [(out, mask, "set")], engine, free_size(shape))
    out.write_mask = mask
    return out


def reduce_axes(axis: Any, ndim: int, what: str) -> tuple[int, ...]:
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    result = tuple(int(a) % ndim for a in axes)
    if 0 in result:
        raise NkiError(
            f"{what}: reducing over the partition dimension (axis 0) is not supported; "
            "reduce along free axes, or transpose (nisa.nc_transpose) / matmul against ones first"
        )
    return result


def reduce_fn(
    op: str, axes: tuple[int, ...], keepdims: bool, negate: bool = False
) -> Callable[..., Any]:
    base = REDUCE[op]

    def reduce(x: Any) -> Any:
        r = base(f32(x), axis=axes, keepdims=keepdims)
        return -r if negate else r

    reduce.lowering = ("reduce", op, axes, keepdims, negate, 1)  # type: ignore[attr-defined]
    return row_wise(reduce)  # axes never include the partition axis (reduce_axes)


def reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if n in axes else d for n, d in enumerate(shape))
    return tuple(d for n, d in enumerate(shape) if n not in axes)


def check_matmul(stationary: Tile, moving: Tile, what: str) -> tuple[int, int, int]:
    """Tensor Engine layout rules; returns (K, M, N) for stationary [K, M], moving [K, N]."""
    for name, t in (("stationary", stationary), ("moving", moving)):
        if not isinstance(t, Tile) or t.buffer.name != "sbuf":
            where = t.buffer.name if isinstance(t, Tile) else type(t).__name__
            raise NkiError(f"{what}: the {name} operand must be an SBUF tile, got {where}")
        if len(t.shape) != 2:
            raise NkiError(f"{what}: the {name} operand must be 2-D, got shape {t.shape}")
        if not dtypes.is_float(t.dtype):
            raise NkiError(
                f"{what}: the Tensor Engine takes float8/bfloat16/float16/tfloat32/float32 "
                f"inputs, got {dtypes.name(t.dtype)}"
            )
    k, m = stationary.shape
    k2, n = moving.shape
    if k != k2:
        raise NkiError(
            f"{what}: stationary and moving must share the partition (contraction) size, "
            f"got {k} and {k2}"
        )
    if k > PARTITIONS:
        raise NkiError(f"{what}: contraction (partition) size {k} exceeds {PARTITIONS}")
    if m > GEMM_STATIONARY_FMAX:
        raise NkiError(
            f"{what}: stationary free size {m} exceeds the Tensor Engine's "
            f"{GEMM_STATIONARY_FMAX} (nl.tile_size.gemm_stationary_fmax)"
        )
    if n > GEMM_MOVING_FMAX:
        raise NkiError(
            f"{what}: moving free size {n} exceeds the Tensor Engine's {GEMM_MOVING_FMAX} "
            "(nl.tile_size.gemm_moving_fmax)"
        )
    return k, m, n


def check_psum_dst(dst: Tile, shape: tuple[int, ...], what: str, input_dtype: Any = None) -> None:
    """`input_dtype`: transpose mode, whose result may keep the input's dtype."""
    if dst.buffer.name != "psum":
        raise NkiError(f"{what}: the Tensor Engine writes PSUM; dst is in {dst.buffer.name}")
    widened = dst.dtype == dtypes.float32 or dst.dtype is dtypes.bfloat16
    if not widened and not (input_dtype is not None and dst.dtype == input_dtype):
        raise NkiError(
            f"{what}: matmul accumulates in float32 in PSUM; dst dtype is {dtypes.name(dst.dtype)}"
        )
    if dst.shape != shape:
        raise NkiError(f"{what}: dst shape {dst.shape} differs from the result shape {shape}")


def _cpu_tensor(x: np.ndarray) -> torch.Tensor:
    x = f32(x)
    if not x.flags.writeable or any(stride < 0 for stride in x.strides):
        x = x.copy()  # torch.from_numpy views neither read-only memory nor negative strides
    return torch.from_numpy(x)


def matmul_fn(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    # torch.mm (oneDNN/MKL) is the one matmul both the interpreter and the compiled path
    # call, so the two agree bit for bit; numpy's OpenBLAS is several times slower at
    # tile sizes on a shared host.
    return torch.mm(_cpu_tensor(x).T, _cpu_tensor(y)).numpy()


matmul_fn.lowering = ("matmul",)  # type: ignore[attr-defined]


def matmul_into(
    dst: Tile,
    stationary: Tile,
    moving: Tile,
    accumulate: bool | None,
    mask: Any,
    what: str,
    transpose: bool = False,
) -> None:
    """dst = stationary.T @ moving: overwritten (False), accumulated (True), or, for None,
    overwritten where dst was never written since its allocation and accumulated elsewhere."""
    k, m, n = check_matmul(stationary, moving, what)
    check_psum_dst(dst, (m, n), what, stationary.dtype if transpose else None)
    mode = "acc_after_first" if accumulate is None else "acc" if accumulate else "set"
    wide = "float32" in (dtypes.name(stationary.dtype), dtypes.name(moving.dtype))
    interpreter.current().usage.matmul_flops["fp32" if wide else "bf16"] += 2 * k * m * n
    interpreter.execute(matmul_fn, [stationary, moving], [(dst, mask, mode)], "tensor", n + 64)


def matmul_result(stationary: Tile, moving: Tile, mask: Any, what: str) -> Tile:
    _, m, n = check_matmul(stationary, moving, what)
    out = new_tile((m, n), dtypes.float32, psum)
    matmul_into(out, stationary, moving, False, mask, what)
    return out
