"""Live device bytes over time, from the storages a traced step creates and frees.

Why storages: the caching allocator hands out one block per storage, so the sum of the live
storages' rounded sizes is what ``torch.neuron.memory_allocated()`` reports. The trace runs
under FakeTensorMode, so nothing is allocated; a storage's death is seen through a weak
reference, exactly when the real one would be freed.

Sharded steps need three more things, all handled here: a tensor subclass (DTensor) holds its
memory in inner tensors, so the mode lets the subclass run and sees its local ops; DTensor's
sharding propagation runs each op once more on global-shape fake tensors to learn the output
shape, which the real run never allocates, so those are not counted; and FSDP2 frees and
re-allocates its gathered parameters with ``UntypedStorage.resize_``, which no dispatch mode
sees, so resizes are followed while the tracker is active (one storage, several lives).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

# Operator namespaces of collectives and of FSDP2's copies into and out of their buffers:
# storages they read or write (other than parameters, gradients and optimizer state) are
# collective buffers, such as FSDP2's gathered parameters.
_COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "_dtensor", "fsdp")

# The caching allocator's rounding (csrc/aten/memory/caching_allocator.cpp).
_MIN_BLOCK = 512
_SMALL_SIZE = 1 << 20
_MIN_LARGE_ALLOC = 10 << 20
_LARGE_ROUNDING = 2 << 20


def block_bytes(nbytes: int) -> int:
    """The bytes the caching allocator counts as allocated for a request of ``nbytes``."""
    if nbytes <= 0:
        return 0
    size = -(-nbytes // _MIN_BLOCK) * _MIN_BLOCK
    if size >= _MIN_LARGE_ALLOC:
        # A large request gets its own segment, rounded to 2 MiB; a remainder of at most
        # 1 MiB is not split off, so the whole segment is counted.
        segment = -(-size // _LARGE_ROUNDING) * _LARGE_ROUNDING
        if segment - size <= _SMALL_SIZE:
            return segment
    return size


@dataclass
class StorageRecord:
    serial: int
    nbytes: int
    phase: str
    born: int  # event index
    died: int | None = None
    shape: tuple[int, ...] = ()
    collective: bool = False  # read or written by a collective


def plain_tensors(tensor: Any) -> Iterator[torch.Tensor]:
    """The tensors holding ``tensor``'s memory: itself, or a subclass's inner tensors."""
    if not isinstance(tensor, torch.Tensor):
        return
    if is_traceable_wrapper_subclass(tensor):
        names, _ = tensor.__tensor_flatten__()
        for name in names:
            yield from plain_tensors(getattr(tensor, name))
    else:
        yield tensor


@dataclass
class LiveBytesTrace:
    """Every storage seen, in order, with when it was born and when it died."""

    records: list[StorageRecord] = field(default_factory=list)
    events: int = 0

    def peak(self) -> tuple[int, int]:
        """(peak bytes, event index at which it was reached)."""
        deltas: dict[int, int] = {}
        for r in self.records:
            deltas[r.born] = deltas.get(r.born, 0) + r.nbytes
            if r.died is not None:
                deltas[r.died] = deltas.get(r.died, 0) - r.nbytes
        live = best = best_at = 0
        for index in sorted(deltas):
            live += deltas[index]
            if live > best:
                best, best_at = live, index
        return best, best_at

    def since(self, index: int) -> LiveBytesTrace:
        """The storages alive at event ``index`` or born after it (a step after its setup)."""
        kept = [r for r in self.records if r.died is None or r.died > index]
        return LiveBytesTrace(kept, self.events)

    def live_at(self, index: int) -> list[StorageRecord]:
        return [r for r in self.records if r.born <= index and (r.died is None or r.died > index)]

    def timeline(self, points: int = 200) -> list[tuple[int, int]]:
        """(event index, live bytes) sampled at up to ``points`` event indices."""
        deltas: dict[int, int] = {}
        for r in self.records:
            deltas[r.born] = deltas.get(r.born, 0) + r.nbytes
            if r.died is not None:
                deltas[r.died] = deltas.get(r.died, 0) - r.nbytes
        live = 0
        series = []
        for index in sorted(deltas):
            live += deltas[index]
            series.append((index, live))
        if len(series) <= points:
            return series
        step = len(series) / points
        return [series[int(i * step)] for i in range(points)] + [series[-1]]


class LiveBytesTracker(TorchDispatchMode):
    """Records each new storage an op returns, on ``device_type``, and when it dies.

    Use inside FakeTensorMode (this mode on top), or on a real device: both work the same.
    """

    def __init__(self, device_type: str = "neuron") -> None:
        super().__init__()
        self.device_type = device_type
        self.trace = LiveBytesTrace()
        self.phase = "setup"
        # storage -> its current life's serial, in a list the death callback shares
        self._serial_of: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._by_serial: dict[int, StorageRecord] = {}
        self._quiet = 0  # > 0 while DTensor propagates shapes (nothing real is allocated)
        self._patches = contextlib.ExitStack()

    # -- registering ---------------------------------------------------------------------
    def _tick(self) -> int:
        self.trace.events += 1
        return self.trace.events

    def _on_death(self, cell: list[int], _ref: Any) -> None:
        self._end_life(cell[0])

    def _end_life(self, serial: int) -> None:
        record = self._by_serial.get(serial)
        if record is not None and record.died is None:
            record.died = self._tick()

    def _new_life(self, storage: Any, shape: tuple[int, ...], phase: str) -> int:
        serial = len(self.trace.records)
        record = StorageRecord(
            serial, block_bytes(storage.nbytes()), phase, self._tick(), None, shape
        )
        self.trace.records.append(record)
        self._by_serial[serial] = record
        return serial

    def register(self, tensor: torch.Tensor, phase: str | None = None) -> int | None:
        """Registers the tensor's storage if new; returns its serial (None if not tracked).

        A subclass registers its inner tensors and returns the first one's serial.
        """
        serials = [self._register_plain(t, phase) for t in plain_tensors(tensor)]
        return next((s for s in serials if s is not None), None)

    def _register_plain(self, tensor: torch.Tensor, phase: str | None) -> int | None:
        if tensor.device.type != self.device_type or tensor.layout != torch.strided:
            return None
        storage = tensor.untyped_storage()
        cell = self._serial_of.get(storage)
        if cell is not None:
            return cell[0]
        cell = [self._new_life(storage, tuple(tensor.shape), phase or self.phase)]
        self._serial_of[storage] = cell
        weakref.finalize(storage, self._on_death, cell, None)
        return cell[0]

    def serial_of(self, tensor: torch.Tensor) -> int | None:
        """The current serial of the tensor's storage (a subclass: its first inner tensor's)."""
        for t in plain_tensors(tensor):
            if t.layout == torch.strided and (cell := self._serial_of.get(t.untyped_storage())):
                return cell[0]
        return None

    def _resized(self, storage: Any, old_nbytes: int) -> None:
        """A tracked storage changed size: its old block is freed and a new one allocated.

        Only storages already seen are followed (a fake storage's own device is "meta").
        """
        cell = self._serial_of.get(storage)
        if cell is None or self._quiet or storage.nbytes() == old_nbytes:
            return
        if old_nbytes > 0:
            self._end_life(cell[0])
        if storage.nbytes() > 0:
            record = self._by_serial[cell[0]]
            cell[0] = self._new_life(storage, record.shape, self.phase)

    # -- the mode ------------------------------------------------------------------------
    def __enter__(self) -> LiveBytesTracker:
        self._patches.enter_context(_follow_resizes(self))
        self._patches.enter_context(_quiet_during_shape_propagation(self))
        return super().__enter__()  # type: ignore[return-value]

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._patches.close()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if any(is_traceable_wrapper_subclass(t) for t in inputs):
            # Let the subclass run: its local ops come back through this mode.
            return NotImplemented
        out = func(*args, **kwargs)
        if self._quiet:
            return out
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.register(leaf)
        if getattr(func, "namespace", "") in _COLLECTIVE_NAMESPACES:
            for t in inputs + [x for x in tree_leaves(out) if isinstance(x, torch.Tensor)]:
                serial = self.serial_of(t)
                if serial is not None:
                    self._by_serial[serial].collective = True
        return out


@contextlib.contextmanager
def _follow_resizes(tracker: LiveBytesTracker) -> Iterator[None]:
    """Tells ``tracker`` about every ``UntypedStorage.resize_`` while the context is open."""
    original = torch.UntypedStorage.resize_

    def resize_(storage: torch.UntypedStorage, size: int) -> Any:
        old = storage.nbytes()
        result = original(storage, size)
        tracker._resized(storage, old)
        return result

    torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.UntypedStorage.resize_ = original  # type: ignore[method-assign]


@contextlib.contextmanager
def _quiet_during_shape_propagation(tracker: LiveBytesTracker) -> Iterator[None]:
    """Keeps ``tracker`` from counting the global-shape tensors DTensor's sharding
    propagation makes to learn an op's output shape (a fake computation only)."""
    try:
        from torch.distributed.tensor._sharding_prop import ShardingPropagator
    except ImportError:  # torch built without distributed
        yield
        return
    original = ShardingPropagator._propagate_tensor_meta_non_cached

    def propagate(self: Any, *args: Any, **kwargs: Any) -> Any:
        tracker._quiet += 1
        try:
            return original(self, *args, **kwargs)
        finally:
            tracker._quiet -= 1

    ShardingPropagator._propagate_tensor_meta_non_cached = propagate  # type: ignore[method-assign]
    try:
        yield
    finally:
        ShardingPropagator._propagate_tensor_meta_non_cached = original  # type: ignore[method-assign]
