"""``nki.language`` (``nl``): tiles, memory, math, indexing and SPMD queries.

Import as ``import torchneuron.nki.language as nl``. Functions take tiles (SBUF or PSUM)
and return new SBUF tiles, as NKI's legacy ``neuronxcc.nki.language`` does; ``nl.load``
and ``nl.store`` move data between HBM and SBUF, and ``nl.matmul`` returns a PSUM tile.
"""

from __future__ import annotations

import builtins
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from . import dtypes, indirect_dma, interpreter, ops, tensor_views
from .access_patterns import access_pattern
from .chip_profile import BN_STATS_FMAX, GEMM_MOVING_FMAX, GEMM_STATIONARY_FMAX, PARTITIONS
from .control_flow import (  # noqa: F401
    NkiScalar,
    dynamic_range,
    fori_loop,
    if_else,
    no_reorder,
    while_loop,
)
from .dtypes import (  # noqa: F401  (re-exported NKI names)
    bfloat16,
    bool_,
    float8_e4m3,
    float8_e4m3fn,
    float8_e5m2,
    float16,
    float32,
    int8,
    int16,
    int32,
    tfloat32,
    uint8,
    uint16,
    uint32,
)
from .dtypes import canonical as _canonical
from .dtypes import host as _host_dtype
from .errors import NkiError
from .indexing import arange, ds, mgrid  # noqa: F401
from .indirect_dma import VectorIndirectView, vector_select
from .language_math import (  # noqa: F401  (nl's math functions)
    abs,
    abs_max,
    abs_min,
    add,
    all,
    arctan,
    bitwise_and,
    bitwise_or,
    bitwise_xor,
    ceil,
    cos,
    divide,
    equal,
    erf,
    erf_dx,
    exp,
    floor,
    fmod,
    gather_flattened,
    gelu,
    gelu_apprx_sigmoid,
    gelu_apprx_sigmoid_dx,
    gelu_apprx_tanh,
    gelu_dx,
    greater,
    greater_equal,
    invert,
    left_shift,
    less,
    less_equal,
    log,
    logical_and,
    logical_not,
    logical_or,
    logical_xor,
    max,
    maximum,
    mean,
    min,
    minimum,
    mish,
    mod,
    multiply,
    negative,
    not_equal,
    power,
    prod,
    reciprocal,
    relu,
    right_shift,
    rms_norm,
    rsqrt,
    sigmoid,
    sign,
    silu,
    silu_dx,
    sin,
    softmax,
    softplus,
    sqrt,
    square,
    subtract,
    sum,
    tan,
    tanh,
    trunc,
    var,
    where,
)
from .random_numbers import dropout, rand, random_seed  # noqa: F401
from .tiles import (  # noqa: F401
    IndirectAccess,
    Tile,
    hbm,
    par_dim,
    private_hbm,
    psum,
    sbuf,
    shared_hbm,
)

bool = bool_  # noqa: A001  (NKI exposes nl.bool_; some kernels write nl.bool)


class tile_size:  # noqa: N801  (NKI's name)
    """Hardware tile limits kernels size their loops by."""

    pmax = PARTITIONS
    psum_fmax = GEMM_MOVING_FMAX
    gemm_stationary_fmax = GEMM_STATIONARY_FMAX
    gemm_moving_fmax = GEMM_MOVING_FMAX
    bn_stats_fmax = BN_STATS_FMAX
    psum_min_align = 4
    sbuf_min_align = 1


# -- allocation ------------------------------------------------------------------------
def static_cast(array: Any, dtype: Any) -> np.ndarray:
    """Host-side: a numpy array converted to an NKI dtype (bfloat16 as ml_dtypes')."""
    return np.asarray(array).astype(_host_dtype(_canonical(dtype)))


def ndarray(
    shape: Any, dtype: Any = float32, *, buffer: Any = None, name: str = "", **_: Any
) -> Tile:
    """A new tensor/tile in `buffer` (SBUF by default). Contents are undefined on hardware;
    the interpreter fills it with NaN or 4 (interpreter.uninitialized_value)."""
    return interpreter.current().allocate(shape, dtype, buffer or sbuf)


def _filled(shape: Any, value: Any, dtype: Any, buffer: Any) -> Tile:
    tile = ndarray(shape, dtype, buffer=buffer)
    interpreter.execute(
        ops.constant_fn(value), [], [(tile, None, "set")], "gpsimd", ops.free_size(tile.shape)
    )
    return tile


def zeros(
    shape: Any, dtype: Any = float32, *, buffer: Any = None, name: str = "", **_: Any
) -> Tile:
    return _filled(shape, 0, dtype, buffer)


def ones(shape: Any, dtype: Any = float32, *, buffer: Any = None, name: str = "", **_: Any) -> Tile:
    return _filled(shape, 1, dtype, buffer)


def full(
    shape: Any,
    fill_value: Any,
    dtype: Any = float32,
    *,
    buffer: Any = None,
    name: str = "",
    **_: Any,
) -> Tile:
    return _filled(shape, fill_value, dtype, buffer)


def empty_like(a: Tile, dtype: Any = None, *, buffer: Any = None, **_: Any) -> Tile:
    return ndarray(a.shape, dtype or a.dtype, buffer=buffer or a.buffer)


def zeros_like(a: Tile, dtype: Any = None, *, buffer: Any = None, **_: Any) -> Tile:
    return zeros(
        a.shape, dtype or a.dtype, buffer=buffer or (a.buffer if a.buffer.on_chip else sbuf)
    )


def ones_like(a: Tile, dtype: Any = None, *, buffer: Any = None, **_: Any) -> Tile:
    return ones(
        a.shape, dtype or a.dtype, buffer=buffer or (a.buffer if a.buffer.on_chip else sbuf)
    )


# Identity matrices made by shared_identity_matrix: NKI 0.8 places them in SBUF, the legacy
# API as an HBM constant (shared_constant's behaviour) that kernels nl.load; both read them.
_SHARED_IDENTITIES: weakref.WeakSet[Any] = weakref.WeakSet()


def shared_identity_matrix(n: int, dtype: Any = float32, **_: Any) -> Tile:
    tile = ndarray((n, n), dtype)
    interpreter.execute(lambda: np.eye(n, dtype=np.float32), [], [(tile, None, "set")], "gpsimd", n)
    _SHARED_IDENTITIES.add(tile.storage)
    return tile


def _buffer_name(buffer: Any) -> str:
    name = getattr(buffer, "name", buffer)
    if not isinstance(name, str):
        raise NkiError(f"expected a buffer (nl.sbuf, nl.psum, nl.hbm, ...), got {buffer!r}")
    return name.lower()


def is_hbm(buffer: Any) -> bool:
    """Whether the buffer is device memory (nl.hbm, nl.shared_hbm, nl.private_hbm)."""
    return _buffer_name(buffer) in ("hbm", "shared_hbm", "private_hbm")


def is_psum(buffer: Any) -> bool:
    return _buffer_name(buffer) == "psum"


def is_sbuf(buffer: Any) -> bool:
    return _buffer_name(buffer) == "sbuf"


def is_on_chip(buffer: Any) -> bool:
    return is_sbuf(buffer) or is_psum(buffer)


# -- data movement ---------------------------------------------------------------------
def _dma_check(src: Tile, dst_on_chip: bool, what: str) -> None:
    if not isinstance(src, Tile):
        raise NkiError(f"{what}: expected a tensor or tile, got {type(src).__name__}")


def load(src: Tile, *, mask: Any = None, dtype: Any = None, **_: Any) -> Tile:
    """HBM → SBUF: a new SBUF tile holding `src` (the first dimension is the partition)."""
    if isinstance(src, IndirectAccess):
        return _gather(src, mask, dtype)
    if isinstance(src, VectorIndirectView):
        tile = ndarray(src.shape, dtype or src.dtype)
        indirect_dma.copy(tile, src, mask, False, False, "nl.load")
        return tile
    _dma_check(src, True, "nl.load")
    if src.buffer.on_chip and src.storage in _SHARED_IDENTITIES:
        tile = ndarray(src.shape, dtype or src.dtype)  # the legacy API's HBM constant
        dma(tile, src, mask)
        return tile
    if src.buffer.on_chip:
        raise NkiError(
            f"nl.load reads HBM; the source is already in {src.buffer.name} (use nl.copy)"
        )
    tile = ndarray(src.shape, dtype or src.dtype)
    dma(tile, src, mask)
    return tile


def _gather(src: IndirectAccess, mask: Any, dtype: Any) -> Tile:
    """An indirect DMA: the index tiles are read when it runs, in both execution paths."""
    for index in src.index_tiles:  # on chip; their values are truncated to integers
        ops.compute(index, "an indirect DMA's indices")
    tile = ndarray(src.shape, dtype or src.dtype)
    ins = [src.tensor, *src.index_tiles]
    nbytes = int(np.prod(src.shape, dtype=np.int64)) * src.dtype.itemsize
    interpreter.execute(src.gather_fn(), ins, [(tile, mask, "set")], "dma", nbytes)
    return tile


def load_transpose2d(src: Tile, *, mask: Any = None, dtype: Any = None, **_: Any) -> Tile:
    """HBM [F, P] → SBUF [P, F] (the DMA transposes)."""
    if src.buffer.on_chip or len(src.shape) != 2:
        raise NkiError("nl.load_transpose2d reads a 2-D HBM tensor")
    tile = ndarray(src.shape[::-1], dtype or src.dtype)
    interpreter.execute(np.transpose, [src], [(tile, mask, "set")], "dma", _bytes(src))
    return tile


def store(dst: Tile, value: Any, *, mask: Any = None, **_: Any) -> None:
    """SBUF → HBM: writes `value` to the HBM access `dst`."""
    if isinstance(dst, VectorIndirectView):
        indirect_dma.copy(dst, interpreter.operand(value), mask, False, False, "nl.store")
        return
    if isinstance(dst, IndirectAccess):
        indirect_dma.legacy_copy(dst, value, mask, False, False, "nl.store")
        return
    if not isinstance(dst, Tile) or dst.buffer.on_chip:
        where = dst.buffer.name if isinstance(dst, Tile) else type(dst).__name__
        raise NkiError(
            f"nl.store writes HBM; the destination is {where} (use nl.copy or '=' on chip)"
        )
    dma(dst, value, mask)


def _bytes(tile: Tile) -> int:
    return int(np.prod(tile.shape, dtype=np.int64)) * tile.dtype.itemsize


def dma(dst: Tile, src: Any, mask: Any) -> None:
    """One DMA transfer: HBM↔SBUF (either side may be HBM; SBUF↔SBUF is allowed too)."""
    src = interpreter.operand(src)
    if isinstance(src, Tile):
        if src.buffer.name == "psum" and not dst.buffer.on_chip:
            pass  # stores from PSUM are accepted, as the compiler inserts the copy
        if dst.buffer.on_chip:
            from .tiles import check_partition

            check_partition(dst.shape, dst.par_axis, "DMA into " + dst.buffer.name)
        if src.shape != dst.shape and np.prod(src.shape) != np.prod(dst.shape):
            raise NkiError(f"DMA shapes differ: source {src.shape}, destination {dst.shape}")
        launch = interpreter.current()
        launch.usage.dma_bytes += _bytes(dst)
        if not (src.buffer.on_chip and dst.buffer.on_chip):
            launch.usage.hbm_bytes += _bytes(dst)
        fn = _reshaper(dst.shape) if src.shape != dst.shape else interpreter._identity
        interpreter.execute(fn, [src], [(dst, mask, "set")], "dma", _bytes(dst))
    else:
        interpreter.execute(lambda: np.asarray(src), [], [(dst, mask, "set")], "dma", _bytes(dst))


def _reshaper(shape: tuple[int, ...]) -> Callable[[np.ndarray], np.ndarray]:
    def reshape(x: np.ndarray) -> np.ndarray:
        return np.reshape(x, shape)

    return reshape


def copy(src: Any, *, mask: Any = None, dtype: Any = None, **_: Any) -> Tile:
    """A copy of a tile (on chip; a PSUM source lands in SBUF), optionally converted."""
    return ops.elementwise("copy", [src], dtype if dtype is not None else _dtype_of(src), mask)


def _dtype_of(value: Any) -> Any:
    return value.dtype if isinstance(value, Tile) else float32


# -- matmul and layout -----------------------------------------------------------------
def matmul(x: Tile, y: Tile, *, transpose_x: bool = False, mask: Any = None, **_: Any) -> Tile:
    """``x @ y`` on the Tensor Engine, result in PSUM (float32). With transpose_x=True `x`
    is given as [K, M] (contraction on partitions), otherwise as [M, K] and transposed."""
    stationary = x if transpose_x else transpose(x)
    return ops.matmul_result(stationary, y, mask, "nl.matmul")


def transpose(x: Tile, *, dtype: Any = None, mask: Any = None, **_: Any) -> Tile:
    """Swaps the partition and the free dimension of a 2-D tile (both at most 128)."""
    ops.compute(x, "nl.transpose")
    if len(x.shape) != 2 or x.shape[1] > PARTITIONS:
        raise NkiError(f"nl.transpose takes a 2-D tile with both sizes at most 128, got {x.shape}")
    out = ops.new_tile(x.shape[::-1], dtype if dtype is not None else x.dtype)
    interpreter.execute(np.transpose, [x], [(out, mask, "set")], "tensor", x.shape[1] + 64)
    return out


def broadcast_to(src: Tile, shape: Any, **_: Any) -> Tile:
    """`src` repeated to `shape` (size-1 dimensions broadcast)."""
    ops.compute(src, "nl.broadcast_to")
    shape = tuple(int(d) for d in shape)
    rank = len(shape)
    # aligned on the partition dimension, as NKI aligns operands: a [P] tile is [P, 1]
    aligned = src.shape + (1,) * builtins.max(rank - len(src.shape), 0)
    try:
        if np.broadcast_shapes(aligned, shape) != shape:
            raise ValueError
    except ValueError:
        raise NkiError(f"nl.broadcast_to: cannot broadcast {src.shape} to {shape}") from None
    out = ops.new_tile(shape, src.dtype)

    def body(x: Any) -> Any:
        return ops.pad(x, rank)

    body.lowering = ("copy", True)  # type: ignore[attr-defined]
    interpreter.execute(body, [src], [(out, None, "set")], "vector", ops.free_size(shape))
    return out


def expand_dims(data: Tile, axis: int, **_: Any) -> Tile:
    ops.compute(data, "nl.expand_dims")
    shape = list(data.shape)
    shape.insert(axis if axis >= 0 else len(shape) + 1 + axis, 1)
    out = ops.new_tile(tuple(shape), data.dtype)
    interpreter.execute(_reshape_to(tuple(shape)), [data], [(out, None, "set")], "vector", 1)
    return out


def _reshape_to(shape: tuple[int, ...]) -> Callable[[np.ndarray], np.ndarray]:
    return lambda x: np.reshape(x, shape)


# -- SPMD and loops --------------------------------------------------------------------
def program_id(axis: int) -> int:
    """This program instance's index along launch-grid `axis`."""
    launch = interpreter.current()
    if not 0 <= axis < builtins.max(len(launch.grid), 1):
        raise NkiError(
            f"nl.program_id({axis}): the launch grid {launch.grid} has {len(launch.grid)} axes"
        )
    return launch.program_ids[axis] if launch.grid else 0


def num_programs(axes: Any = None) -> Any:
    grid = interpreter.current().grid or (1,)
    if axes is None:
        return int(np.prod(grid))
    if isinstance(axes, int):
        return grid[axes]
    return tuple(grid[a] for a in axes)


def program_ndim() -> int:
    return len(interpreter.current().grid)


class _AffineRange:
    """An affine_range while a kernel is traced: iterates like `range`, and tags the
    instructions of each iteration for the compiled path's loop batching."""

    def __init__(self, values: range, launch: interpreter.Launch) -> None:
        self.values = values
        self.launch = launch

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, index: Any) -> Any:
        return self.values[index]

    def __iter__(self) -> Any:
        return self.launch.iterate(self.values)


def affine_range(*args: int, **_: Any) -> Any:
    """Loop whose iterations are independent (the compiler may reorder/pipeline them)."""
    values = range(*args)
    launch = interpreter.active()
    if launch is None or launch.steps is None:
        return values
    return _AffineRange(values, launch)


def sequential_range(*args: int, **_: Any) -> range:
    """Loop with a dependence between iterations (run in order)."""
    return range(*args)


def static_range(*args: int, **_: Any) -> range:
    """Loop unrolled at trace time."""
    return range(*args)


def device_print(prefix: str, x: Tile, **_: Any) -> None:
    """Prints a tile's current values (simulator only; a no-op in the compiled path)."""
    print(prefix, interpreter.read(x, False))


class LoopReduce:
    """What ``nl.loop_reduce`` returns: assigned into a tile (``acc[...] = nl.loop_reduce(x,
    op=np.add, loop_indices=(i,))``), it combines the tile with `x` by `op` in place, so the
    tile accumulates over the loop's iterations (in the tile's own dtype)."""

    def __init__(self, x: Tile, op: Any, mask: Any) -> None:
        self.x, self.op, self.mask = x, op, mask


def loop_reduce(
    x: Tile, op: Any, loop_indices: Any, *, dtype: Any = None, mask: Any = None, **_: Any
) -> LoopReduce:
    """A reduction across a loop's iterations into the tile it is assigned to (Vector
    engine); see LoopReduce. `dtype` is accepted for NKI's signature: the result takes the
    assigned tile's dtype, as every write does."""
    name = ops.op_name(op)
    if name not in ops.BINARY:
        raise NkiError(f"nl.loop_reduce: {name} is not a binary operator")
    ops.compute(x, "nl.loop_reduce")
    return LoopReduce(x, op, mask)


def _combine_in_place(target: Tile, reduce: LoopReduce) -> None:
    combine = ops.BINARY[ops.op_name(reduce.op)]

    def body(current: Any, x: Any) -> Any:
        return combine(ops.f32(current), ops.f32(x))

    ins = [target, reduce.x]
    outs = [(target, reduce.mask, "set")]
    interpreter.execute(body, ins, outs, "vector", ops.free_size(target.shape))


def _set_item(tile: Tile, key: Any, value: Any) -> None:
    """``tile[key] = value``: an on-chip copy."""
    target = tile[key]
    if isinstance(value, LoopReduce):
        _combine_in_place(target, value)
        return
    if isinstance(value, Tile) and value.same_access(target):
        return  # `t[k] += v` writes in place, then Python assigns the same access back
    interpreter.assign(target, value)


def _add_in_place(tile: Tile, other: Any) -> Tile:
    """``tile += other``: PSUM accumulation, or an in-place add on SBUF."""
    interpreter.accumulate(tile, other)
    return tile


# Operators on tiles, as NKI defines them (elementwise, results in SBUF).
def _install_operators() -> None:
    def swap(fn: Callable[..., Tile]) -> Callable[..., Tile]:
        return lambda self, other: fn(other, self)

    pairs = {
        "add": add,
        "sub": subtract,
        "mul": multiply,
        "truediv": divide,
        "pow": power,
        "and": logical_and,
        "or": logical_or,
        "xor": logical_xor,
    }
    for name, fn in pairs.items():
        setattr(Tile, f"__{name}__", lambda self, other, fn=fn: fn(self, other))
        setattr(Tile, f"__r{name}__", swap(fn))
    for name, fn in {
        "lt": less,
        "le": less_equal,
        "gt": greater,
        "ge": greater_equal,
        "eq": equal,
        "ne": not_equal,
    }.items():
        setattr(Tile, f"__{name}__", lambda self, other, fn=fn: fn(self, other))
    Tile.__neg__ = lambda self: negative(self)  # type: ignore[method-assign]
    Tile.__setitem__ = _set_item  # type: ignore[method-assign]
    Tile.__iadd__ = _add_in_place  # type: ignore[method-assign]
    Tile.__invert__ = lambda self: invert(self)  # type: ignore[method-assign]
    Tile.__hash__ = object.__hash__  # type: ignore[method-assign]
    # ``tile.broadcast_to(shape)``, the method form public kernels use (RMSNorm tutorial)
    Tile.broadcast_to = lambda self, shape: broadcast_to(self, shape)  # type: ignore[attr-defined]
    Tile.ap = access_pattern  # type: ignore[attr-defined]
    Tile.vector_select = vector_select  # type: ignore[attr-defined]
    Tile.is_indirect = lambda self: False  # type: ignore[attr-defined]
    for name, method in tensor_views.METHODS.items():  # NKI 0.8's NkiTensor views
        setattr(Tile, name, method)


_install_operators()


# -- host-side constants and launch helpers ---------------------------------------------------
def finfo(dtype: Any) -> Any:
    """Limits of a float dtype (numpy's finfo; ml_dtypes' for bfloat16): .min, .max, .eps."""
    nki_dtype = _canonical(dtype)
    if dtypes.needs_rounding(nki_dtype):
        import ml_dtypes

        return ml_dtypes.finfo(_host_dtype(nki_dtype))
    return np.finfo(nki_dtype)


fp32 = finfo(float32)  # nl.fp32.min / .max in AWS's kernels


def shared_constant(constant: Any, dtype: Any = None, **_: Any) -> Tile:
    """An HBM tensor holding a constant known when the kernel is traced (an identity matrix
    for transposes, a lookup table), as the compiler embeds it in the NEFF."""
    values = np.asarray(constant)
    nki_dtype = _canonical(dtype if dtype is not None else values.dtype)
    tile = ndarray(values.shape, nki_dtype, buffer=shared_hbm)
    fixed = values.astype(np.float32) if dtypes.is_float(nki_dtype) else values

    def fill() -> Any:
        return fixed

    interpreter.execute(fill, [], [(tile, None, "set")], "dma")
    return tile


def nc(count: int) -> int:
    """A launch grid dimension spread over `count` NeuronCores (``nl.spmd_dim(n, nl.nc(2))``):
    here the instances run one after another, so it is `count` instances."""
    if int(count) < 1:
        raise NkiError(f"nl.nc({count}): a positive number of NeuronCores")
    return int(count)


def spmd_dim(*sizes: Any) -> int:
    """One launch grid dimension made of several (``kernel[nl.spmd_dim(4, nl.nc(2)), 2]``):
    their product."""
    total = 1
    for size in sizes:
        if int(size) < 1:
            raise NkiError(f"nl.spmd_dim{sizes}: every size must be positive")
        total *= int(size)
    return total
