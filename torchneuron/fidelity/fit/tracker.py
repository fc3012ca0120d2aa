"""Live device bytes over time, from the storages a traced step creates and frees.

Why storages: the caching allocator hands out one block per storage, so the sum of the live
storages' rounded sizes is what ``torch.neuron.memory_allocated()`` reports. The trace runs
under FakeTensorMode, so nothing is allocated; a storage's death is seen through a weak
reference, exactly when the real one would be freed.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

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
        self._serial_of: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._by_serial: dict[int, StorageRecord] = {}

    # -- registering ---------------------------------------------------------------------
    def _tick(self) -> int:
        self.trace.events += 1
        return self.trace.events

    def _on_death(self, serial: int, _ref: Any) -> None:
        record = self._by_serial.get(serial)
        if record is not None and record.died is None:
            record.died = self._tick()

    def register(self, tensor: torch.Tensor, phase: str | None = None) -> int | None:
        """Registers the tensor's storage if new; returns its serial (None if not tracked)."""
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != self.device_type:
            return None
        if tensor.layout != torch.strided:
            return None
        storage = tensor.untyped_storage()
        serial = self._serial_of.get(storage)
        if serial is not None:
            return serial
        serial = len(self.trace.records)
        record = StorageRecord(
            serial,
            block_bytes(storage.nbytes()),
            phase or self.phase,
            self._tick(),
            shape=tuple(tensor.shape),
        )
        self.trace.records.append(record)
        self._by_serial[serial] = record
        self._serial_of[storage] = serial
        weakref.finalize(storage, self._on_death, serial, None)
        return serial

    def serial_of(self, tensor: torch.Tensor) -> int | None:
        if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.strided:
            return None
        return self._serial_of.get(tensor.untyped_storage())

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.register(leaf)
        return out
