"""The interpreter: one launch's state, allocation with capacity checks, and the execution
(and, when tracing for the compiled path, the recording) of every tile read and write.

Every instruction is a pure function over numpy arrays (`fn`) plus the tiles it reads and
writes. :func:`execute` reads the input tiles, calls `fn`, and writes the results with the
destination's dtype rounding, mask predicate and accumulate mode. The same steps, recorded
once per input signature, are what :mod:`.codegen` turns into straight-line host code.
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import dtypes
from .chip_profile import PSUM_BANK_BYTES, PSUM_BANKS, ChipProfile, current_profile
from .errors import NkiCapacityError, NkiError
from .occupancy import Occupancy, largest
from .tiles import Buffer, Storage, Tile, check_partition, split_shape


@dataclass
class Ref:
    """A tile access as the compiled path replays it."""

    sid: int
    keys: tuple[Any, ...]
    adv: tuple[Any, ...] | None
    stacked: bool = False  # a batched loop's access: every iteration's rows, stacked


@dataclass
class Step:
    fn: Callable[..., Any]
    ins: list[Any]  # Ref or constant
    outs: list[tuple[Ref, Any, str]]  # (destination, mask or None, "set" | "acc")
    engine: str
    allocated: int | None = None  # for "alloc" steps: the new storage's id
    loops: tuple[tuple[int, int], ...] = ()  # enclosing affine_range loops: (loop, iteration)
    batch: tuple[int, int] | None = None  # batched loop step: (iterations, rows per iteration)


def _zeros() -> None:
    return None


@dataclass
class Usage:
    """What a traced kernel used: instructions per engine, bytes moved, on-chip peaks."""

    instructions: Counter = field(default_factory=Counter)
    engine_cycles: Counter = field(default_factory=Counter)
    dma_bytes: int = 0  # every DMA (HBM<->SBUF and on-chip copies by DMA)
    hbm_bytes: int = 0  # the DMAs with an HBM side
    # "fp32", "bf16" (narrower types), "fp8_double_row" (nc_matmul perf_mode)
    matmul_flops: Counter = field(default_factory=Counter)
    sbuf_peak_bytes_per_partition: int = 0
    psum_peak_banks: int = 0


def switch(name: str, value: str | None, default: bool) -> bool:
    """An on/off environment variable of AWS's NKI tools: ``1`` or ``0`` (unset: `default`)."""
    value = (value or "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{name}={value!r}: use 1 or 0")
    return default if value == "" else value == "1"


def simulator_requested() -> bool:
    """NKI_SIMULATOR=1: AWS's switch that runs every ``nki.jit`` kernel in its simulator."""
    return switch("NKI_SIMULATOR", os.environ.get("NKI_SIMULATOR"), default=False)


def precise_fp() -> bool:
    """NKI_PRECISE_FP (default 1): whether the simulator rounds low-precision values."""
    return switch("NKI_PRECISE_FP", os.environ.get("NKI_PRECISE_FP"), default=True)


def uninitialized_value(dtype: Any) -> Any:
    """What a new tile or tensor holds before the kernel writes it: on the chip its contents
    are undefined, so, as in AWS's simulator, NaN (floats) or 4 (integers) — a kernel that
    computes on memory it never wrote shows NaN instead of passing by the luck of zeros."""
    return np.nan if dtypes.is_float(dtypes.canonical(dtype)) else 4


class Launch:
    """State of one kernel launch (all its SPMD program instances)."""

    def __init__(
        self,
        grid: tuple[int, ...],
        hbm_alloc: Callable[[tuple[int, ...], Any], np.ndarray],
        record: bool,
    ) -> None:
        self.grid = grid
        self.program_ids: tuple[int, ...] = (0,) * len(grid)
        self.hbm_alloc = hbm_alloc
        self.profile: ChipProfile = current_profile()
        self.occupancy = Occupancy()
        self.data_dependent = False  # control flow read a device value (control_flow.py)
        self.uses_access_patterns = False  # tensor.ap(), not lowered (access_patterns.py)
        self.random: np.random.Generator | None = None  # nl.rand/dropout (random_numbers.py)
        # the Vector Engine's accumulator registers, per partition (isa_accumulate.py)
        self.vector_accumulator: np.ndarray | None = None
        self.no_reorder_depth = 0  # inside `with nl.no_reorder():` (control_flow.py)
        self.usage = Usage()
        self.shared: list[Storage] = []
        self.shared_cursor = 0
        self.steps: list[Step] | None = [] if record else None
        # NKI_PRECISE_FP=0 is a setting of the simulator (AWS's and this interpreter), not of
        # the hardware: a recording for the compiled path rounds as the hardware does.
        self.rounds_low_precision = record or precise_fp()
        self.inputs_written: set[int] = set()  # positions of the HBM arguments written
        # storages of tensor.view(dtype) copies, which kernels may only read (tensor_views.py)
        self.read_only: dict[int, str] = {}
        self.arrays: dict[int, np.ndarray] = {}  # sid -> array of every storage recorded
        self.roles: dict[int, tuple[str, int]] = {}
        self.nki_dtypes: dict[int, Any] = {}
        self.scratch_count = 0
        self.loop_stack: list[tuple[int, int]] = []
        self.loop_count = 0

    def iterate(self, values: range) -> Any:
        """Runs an affine_range loop, tagging the steps recorded in each iteration (the
        compiled path batches iterations that repeat the same instructions)."""
        loop = self.loop_count
        self.loop_count += 1
        for n, value in enumerate(values):
            self.loop_stack.append((loop, n))
            try:
                yield value
            finally:
                self.loop_stack.pop()

    # -- allocation ----------------------------------------------------------------------
    def allocate(self, shape: Any, dtype: Any, buffer: Buffer) -> Tile:
        ints, par_axis = split_shape(shape)
        dt = dtypes.canonical(dtype)
        if buffer.name == "shared_hbm" and self.program_ids != (0,) * len(self.grid):
            # Every program instance names the same shared tensor: the k-th shared_hbm
            # allocation of each instance is the first instance's k-th.
            if self.shared_cursor >= len(self.shared):
                raise NkiError("program instances allocated different shared_hbm tensors")
            storage = self.shared[self.shared_cursor]
            self.shared_cursor += 1
            if storage.array.shape != ints or storage.dtype != dt:
                raise NkiError("program instances allocated different shared_hbm tensors")
            return Tile(storage)
        if buffer.on_chip:
            check_partition(ints, par_axis, f"{buffer.name} tile")
            array = np.full(ints, uninitialized_value(dt), dtype=dtypes.storage(dt))
        else:
            array = self.hbm_alloc(ints, dt, fill=uninitialized_value(dt))
        storage = Storage(array, buffer, dt, par_axis)
        if buffer.name == "psum":
            storage.fresh = np.ones(ints, dtype=bool)  # for nc_matmul(accumulate=None)
        if buffer.direct:
            self._check_direct(storage)
        elif buffer.name == "sbuf":
            self._charge_sbuf(storage)
        elif buffer.name == "psum":
            self._charge_psum(storage)
        # In a single-instance launch nl.hbm is visible to the caller like nl.shared_hbm, and
        # new-style kernels return nl.hbm tensors; in an SPMD grid it is per instance.
        per_instance = buffer.name == "private_hbm" or (
            buffer.name == "hbm" and int(np.prod(self.grid, dtype=np.int64)) > 1
        )
        if buffer.on_chip or per_instance:
            storage.role = ("scratch", self.scratch_count)
            self.scratch_count += 1
            if self.steps is not None:
                # The compiled path fills fresh tiles with zeros at the same point unless their
                # first write covers them: a kernel that reads what it never wrote gets NaN
                # here and zeros there, both of them what the hardware may give.
                self.roles[storage.sid] = storage.role
                self.arrays[storage.sid] = storage.array
                self.nki_dtypes[storage.sid] = storage.dtype
                # code generation reads a scratch array's layout, never its values: once
                # the kernel drops the tile, its memory goes (AWS's flash-attention backward
                # at 8192 tokens kept every tile of the trace, ~15 GB)
                weakref.finalize(storage, _keep_layout_only, self.arrays, storage.sid)
                self.steps.append(
                    Step(_zeros, [], [], "alloc", storage.sid, tuple(self.loop_stack))
                )
        else:
            storage.role = ("output", len(self.shared))
            self.shared.append(storage)
            self.shared_cursor += 1
        return Tile(storage)

    def _check_direct(self, storage: Storage) -> None:
        """A directly allocated tile (nki.compiler) is placed by the kernel, which may overlap
        tiles on purpose: it is not charged to the automatic allocator, but must lie inside
        SBUF's partition or PSUM's banks."""
        buffer = storage.buffer
        blocks = max(1, int(np.prod(storage.array.shape[: storage.par_axis], dtype=np.int64)))
        physical = min(blocks, buffer.physical_blocks or blocks)
        if buffer.base is None:
            return  # placed block by block by the kernel's function
        if buffer.name == "sbuf":
            end = buffer.base + physical * (storage.bytes_per_partition() // blocks)
            limit = self.profile.sbuf_bytes_per_partition
            if end > limit:
                raise NkiCapacityError(
                    f"ncc.sbuf.mod_alloc(base_addr={buffer.base}): {physical} tile(s) end at "
                    f"byte {end} of a partition, beyond its {limit} bytes on {self.profile.name}"
                )
        elif buffer.base + physical > PSUM_BANKS:
            raise NkiCapacityError(
                f"ncc.psum.mod_alloc(base_bank={buffer.base}): {physical} bank(s) from bank "
                f"{buffer.base} pass the NeuronCore's {PSUM_BANKS} banks"
            )

    def _charge_sbuf(self, storage: Storage) -> None:
        amount = storage.bytes_per_partition()
        limit = self.profile.sbuf_bytes_per_partition
        if amount > limit:
            raise NkiCapacityError(
                f"SBUF is full on {self.profile.name}: one tile of shape {storage.array.shape} "
                f"needs {amount} bytes per partition, beyond its {limit} bytes per partition "
                f"({limit * 128 // 2**20} MiB); tile smaller"
            )
        self.occupancy.allocated(storage.sid, "sbuf", amount, storage.array.shape, storage.dtype)

    def _charge_psum(self, storage: Storage) -> None:
        shape = storage.array.shape
        free = int(np.prod(shape[storage.par_axis + 1 :], dtype=np.int64))
        per_block = free * dtypes.itemsize(storage.dtype)
        if per_block > PSUM_BANK_BYTES:
            raise NkiError(
                f"PSUM tile of shape {shape} needs {per_block} bytes per partition, more than "
                f"one {PSUM_BANK_BYTES}-byte PSUM bank (at most {PSUM_BANK_BYTES // 4} float32 "
                "in the free dimension)"
            )
        banks = max(int(np.prod(shape[: storage.par_axis], dtype=np.int64)), 1)
        if banks > PSUM_BANKS:
            raise NkiCapacityError(
                f"PSUM is full: one tile of shape {shape} needs {banks} banks; the NeuronCore "
                f"has {PSUM_BANKS} banks of {PSUM_BANK_BYTES} bytes per partition"
            )
        self.occupancy.allocated(storage.sid, "psum", banks, shape, storage.dtype)

    def check_occupancy(self) -> None:
        """Records SBUF's and PSUM's peaks by liveness (occupancy.py); raises
        NkiCapacityError if either passes the chip's capacity."""
        sbuf, live = self.occupancy.peak("sbuf")
        self.usage.sbuf_peak_bytes_per_partition = sbuf
        limit = self.profile.sbuf_bytes_per_partition
        if sbuf > limit:
            raise NkiCapacityError(
                f"SBUF is full on {self.profile.name}: {len(live)} tiles live at once (each "
                f"read or written after the others were allocated) need {sbuf} bytes per "
                f"partition, beyond its {limit} bytes per partition "
                f"({limit * 128 // 2**20} MiB); largest: {largest(live)}; free tiles (smaller "
                "loop bodies) or tile smaller"
            )
        banks, live = self.occupancy.peak("psum")
        self.usage.psum_peak_banks = banks
        if banks > PSUM_BANKS:
            raise NkiCapacityError(
                f"PSUM is full: {len(live)} tiles live at once need {banks} banks; the "
                f"NeuronCore has {PSUM_BANKS} banks of {PSUM_BANK_BYTES} bytes per partition"
            )

    # -- recording -----------------------------------------------------------------------
    def ref(self, tile: Tile, safe: bool) -> Ref:
        storage = tile.storage
        if storage.sid not in self.roles:
            assert storage.role is not None
            self.roles[storage.sid] = storage.role
            self.arrays[storage.sid] = storage.array
            self.nki_dtypes[storage.sid] = storage.dtype
        return Ref(storage.sid, tile.keys, tile.adv_safe if safe else tile.adv)


def _keep_layout_only(arrays: dict[int, np.ndarray], sid: int) -> None:
    """Replaces a recorded array by one of the same shape, dtype and strides over anonymous
    memory that is never written: it reads as zeros and holds no pages."""
    array = arrays.get(sid)
    if array is None or array.size == 0 or any(s < 0 for s in array.strides):
        return
    span = array.itemsize + sum(
        (d - 1) * s for d, s in zip(array.shape, array.strides, strict=True)
    )
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
    memory = mmap.mmap(-1, span, flags=flags, prot=mmap.PROT_READ)
    arrays[sid] = np.ndarray(array.shape, array.dtype, buffer=memory, strides=array.strides)


_state = threading.local()


def current() -> Launch:
    launch = getattr(_state, "launch", None)
    if launch is None:
        raise NkiError(
            "NKI language calls run only inside a kernel: decorate the function with "
            "@nki.jit and call it with arrays or tensors"
        )
    return launch


def active() -> Launch | None:
    return getattr(_state, "launch", None)


def enter(launch: Launch | None) -> Launch | None:
    previous = getattr(_state, "launch", None)
    _state.launch = launch
    return previous


# -- reads and writes ----------------------------------------------------------------------
def _touch(tile: Tile) -> None:
    launch = getattr(_state, "launch", None)
    if launch is not None:
        launch.occupancy.touched(tile.storage.sid)


def read(tile: Tile, masked: bool) -> np.ndarray:
    _touch(tile)
    return _load(tile.region, tile, masked)


def _load(view: np.ndarray, tile: Tile, masked: bool) -> np.ndarray:
    """The elements of `view` (the tile's view, or one laid out like it) the tile names."""
    if tile.adv is None:
        return view
    if tile.adv_oob:
        if not masked:
            raise IndexError(
                f"index expression reaches outside a tensor of shape {view.shape}; "
                "guard the access with mask= (e.g. mask=(i_p < size))"
            )
        return view[tile.adv_safe]
    return view[tile.adv]


def _fresh_view(tile: Tile) -> np.ndarray | None:
    """Which elements of the tile's view were never written since allocation (PSUM tiles
    allocated uninitialised), laid out like the view; None when not tracked."""
    storage = tile.storage
    if storage.fresh is None:
        return None
    base, view = storage.array, tile.region
    offset = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    return np.lib.stride_tricks.as_strided(
        storage.fresh.reshape(-1)[offset // base.itemsize :],
        shape=view.shape,
        strides=tuple(s // base.itemsize for s in view.strides),  # bool: one byte per element
    )


def fit_value(values: Any, shape: tuple[int, ...]) -> np.ndarray:
    """`values` as a write into a tile of `shape` sees them: broadcast as numpy does, or, for a
    value with the same partition dimension and the same elements as the tile but other unit
    dimensions (a (128,) reduction written to a (128, 1) tile), reshaped, as the hardware
    addresses both the same way."""
    values = np.asarray(values)
    if values.shape == shape:
        return values
    try:
        return np.broadcast_to(values, shape)
    except ValueError:
        squeezed = tuple(d for d in values.shape if d != 1)
        if values.shape[:1] == shape[:1] and squeezed == tuple(d for d in shape if d != 1):
            return values.reshape(shape)
        raise NkiError(
            f"cannot write a value of shape {values.shape} to a tile of shape {shape}"
        ) from None


def write(tile: Tile, values: Any, mask: Any, mode: str) -> None:
    _touch(tile)
    launch = current()
    if tile.storage.sid in launch.read_only:
        raise NkiError(launch.read_only[tile.storage.sid])
    role = tile.storage.role
    if role is not None and role[0] == "input":
        launch.inputs_written.add(role[1])
    values = fit_value(values, tile.shape)
    fresh = _fresh_view(tile)
    if mode in ("acc", "acc_after_first"):
        total = read(tile, mask is not None).astype(np.float32) + values
        if mode == "acc_after_first" and fresh is not None:
            # nc_matmul(accumulate=None): the first write to a PSUM location overwrites it
            values = np.where(_load(fresh, tile, mask is not None), values, total)
        else:
            values = total
    if dtypes.needs_rounding(tile.dtype) and launch.rounds_low_precision:
        values = dtypes.round_to(values, tile.dtype)
    _store(tile.region, tile, values, mask)
    if fresh is not None:
        _store(fresh, tile, False, mask)


def _store(view: np.ndarray, tile: Tile, values: Any, mask: Any) -> None:
    """Writes `values` to the elements of `view` (laid out like the tile's) the tile names."""
    if mask is None:
        if tile.adv is None:
            np.copyto(view, values, casting="unsafe")
        elif tile.adv_oob:
            raise IndexError(
                f"index expression reaches outside a tensor of shape {view.shape}; "
                "guard the access with mask="
            )
        else:
            view[tile.adv] = values
        return
    where = np.broadcast_to(np.asarray(mask, dtype=bool), tile.shape)
    if tile.adv is None:
        np.copyto(view, values, casting="unsafe", where=where)
        return
    key = tile.adv_safe
    if all(isinstance(k, (int, np.ndarray)) for k in key):
        picked = tuple(
            np.broadcast_to(k, tile.shape)[where] if isinstance(k, np.ndarray) else k for k in key
        )
        view[picked] = np.broadcast_to(values, tile.shape)[where]
    else:
        view[key] = np.where(where, values, view[key])


def operand(value: Any) -> Any:
    if isinstance(value, Tile):
        return value
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return value.item()
    return value


def _recorded_mode(tile: Tile, mode: str, mask: Any) -> str:
    """The write mode the compiled program replays: "acc_after_first" is "acc" there (its
    tiles start as zeros), or "set" when no element of the unmasked view was written yet
    (then the product is stored, not added to zeros: same values, one pass fewer)."""
    if mode != "acc_after_first":
        return mode
    fresh = _fresh_view(tile)
    if fresh is not None and mask is None and tile.adv is None and fresh.all():
        return "set"
    return "acc"


def execute(
    fn: Callable[..., Any],
    ins: list[Any],
    outs: list[tuple[Tile, Any, str]],
    engine: str,
    cycles: int = 0,
) -> None:
    """Runs one instruction: `fn` over the read inputs, results written to `outs`."""
    launch = current()
    masked = any(mask is not None for _, mask, _ in outs)
    args = [read(x, masked) if isinstance(x, Tile) else x for x in ins]
    result = fn(*args)
    if len(outs) == 1:
        result = (result,)
    # Before the writes: an accumulate-after-first write to a view nothing has written yet
    # overwrites all of it, and is recorded as the plain write it is.
    modes = [
        _recorded_mode(tile, mode, mask) if launch.steps is not None else mode
        for tile, mask, mode in outs
    ]
    for (tile, mask, mode), value in zip(outs, result, strict=True):
        write(tile, value, mask, mode)
    launch.usage.instructions[engine] += 1
    launch.usage.engine_cycles[engine] += cycles
    if launch.steps is not None:
        launch.steps.append(
            Step(
                fn,
                [launch.ref(x, masked) if isinstance(x, Tile) else x for x in ins],
                [
                    (launch.ref(t, mask is not None), mask, mode)
                    for (t, mask, _), mode in zip(outs, modes, strict=True)
                ],
                engine,
                loops=tuple(launch.loop_stack),
            )
        )


def _identity(x: np.ndarray) -> np.ndarray:
    return x


_identity.row_wise = True  # type: ignore[attr-defined]
_identity.lowering = ("copy", False)  # type: ignore[attr-defined]


def assign(target: Tile, value: Any) -> None:
    """``tile[key] = value`` (an on-chip copy; HBM is written with nl.store/dma_copy)."""
    if not target.buffer.on_chip:
        raise NkiError(
            f"cannot assign to an {target.buffer.name} tensor directly: store tiles with "
            "nl.store(dst, value) or nisa.dma_copy(dst=..., src=...)"
        )
    if isinstance(value, Tile) and not value.buffer.on_chip:
        raise NkiError("cannot copy from HBM with '=': load it with nl.load or nisa.dma_copy")
    mask = value.write_mask if isinstance(value, Tile) else None
    execute(_identity, [operand(value)], [(target, mask, "set")], "vector", _free_size(target))


def accumulate(target: Tile, value: Any) -> None:
    """``tile += value``: on PSUM, accumulation as the Tensor engine does it (float32; the
    first write to a location starts its accumulation group, so it overwrites what was
    undefined: ``acc = nl.ndarray(..., buffer=nl.psum); acc += nc_matmul(...)``), on SBUF an
    in-place add."""
    if not target.buffer.on_chip:
        raise NkiError("'+=' on an HBM tensor is not allowed; accumulate in SBUF or PSUM")
    mode = "acc_after_first" if target.buffer.name == "psum" else "acc"
    execute(_identity, [operand(value)], [(target, None, mode)], "vector", _free_size(target))


def _free_size(tile: Tile) -> int:
    shape = tile.shape
    return int(np.prod(shape[1:], dtype=np.int64)) if len(shape) > 1 else 1
