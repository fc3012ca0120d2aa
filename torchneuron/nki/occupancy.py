"""On-chip memory occupancy of a launch by liveness: SBUF and PSUM as the NKI compiler
allocates them.

The compiler gives a tile its space from its allocation to its last read or write; a tile a
kernel still names in a Python variable but never touches again holds nothing (AWS's
flash-attention backward and layernorm tutorial rely on it). The interpreter cannot know a
tile's last use while the kernel runs, so it records each on-chip tile's allocation and every
access on one clock, and the launch checks the peak once the kernel has run, before its
results reach the caller. A single tile larger than its buffer is refused at allocation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import dtypes


@dataclass
class Lifetime:
    """One on-chip tile: its buffer, its size there (bytes per partition, or PSUM banks), and
    the clock of its allocation and of its last access."""

    buffer: str
    amount: int
    shape: tuple[int, ...]
    dtype: Any
    born: int
    last: int

    def describe(self) -> str:
        return f"{self.shape} {dtypes.name(self.dtype)}"


class Occupancy:
    """Allocations and accesses of one launch's on-chip tiles, on one clock."""

    def __init__(self) -> None:
        self.clock = 0
        self.tiles: dict[int, Lifetime] = {}

    def allocated(
        self, sid: int, buffer: str, amount: int, shape: tuple[int, ...], dtype: Any
    ) -> None:
        self.tiles[sid] = Lifetime(buffer, amount, shape, dtype, self.clock, self.clock)
        self.clock += 1

    def touched(self, sid: int) -> None:
        tile = self.tiles.get(sid)
        if tile is not None:
            tile.last = self.clock
            self.clock += 1

    def peak(self, buffer: str) -> tuple[int, list[Lifetime]]:
        """The most `buffer` holds at any moment, and the tiles live at that moment."""
        tiles = [t for t in self.tiles.values() if t.buffer == buffer]
        # A tile frees its space after its last access: at one clock, frees come first.
        events = sorted(
            [(t.born, 1, n) for n, t in enumerate(tiles)]
            + [(t.last + 1, 0, n) for n, t in enumerate(tiles)]
        )
        live: set[int] = set()
        held = best = 0
        best_live: set[int] = set()
        for _, starts, n in events:
            if starts:
                live.add(n)
                held += tiles[n].amount
                if held > best:
                    best, best_live = held, set(live)
            else:
                live.discard(n)
                held -= tiles[n].amount
        return best, [tiles[n] for n in sorted(best_live)]


def largest(tiles: list[Lifetime], count: int = 3) -> str:
    """The `count` largest of `tiles`, for an error message."""
    ranked = sorted(tiles, key=lambda t: -t.amount)[:count]
    return ", ".join(f"{t.describe()} ({t.amount})" for t in ranked)
