"""``nki.compiler`` (``import neuronxcc.nki.compiler as ncc``): direct allocation, as AWS's
allocated kernels use it (``buffer=ncc.sbuf.mod_alloc(base_addr=..., num_free_tiles=(2,))``).

Each allocator returns an SBUF or PSUM buffer that follows every rule of ``nl.sbuf`` /
``nl.psum``. The kernel places such tiles itself and may overlap them on purpose, so they are
not charged to the automatic allocator; instead a ``mod_alloc`` tile must end inside the
partition (SBUF: base_addr plus its physical tiles, ``num_free_tiles``) or the 8 banks (PSUM:
base_bank plus ``num_bank_tiles``). Tiles do not share memory here: a kernel that reads a
block after the hardware would have reused its physical tile gets the value it wrote, where
Trainium would give the newer one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from .errors import NkiError
from .tiles import Buffer

_PSUM_BANKS = 8


def _physical(tiles: Sequence[int] | None, what: str) -> int | None:
    if tiles is None or tuple(tiles) == ():
        return None
    counts = tuple(int(t) for t in tiles)
    if any(t < 1 for t in counts):
        raise NkiError(f"{what}: tile counts must be >= 1, got {counts}")
    return math.prod(counts)


class _SbufAllocator:
    def mod_alloc(
        self,
        *,
        base_addr: int,
        base_partition: int = 0,
        num_par_tiles: Sequence[int] = (),
        num_free_tiles: Sequence[int] = (),
    ) -> Buffer:
        if base_addr < 0 or base_partition not in range(128):
            raise NkiError(
                f"ncc.sbuf.mod_alloc: base_addr {base_addr} must be >= 0 and base_partition "
                f"{base_partition} in 0..127"
            )
        physical = _physical(num_free_tiles, "ncc.sbuf.mod_alloc")
        return Buffer("sbuf", True, base=base_addr, physical_blocks=physical, direct=True)

    def alloc(self, allocator: Callable[..., Any]) -> Buffer:
        """An allocation function (block index -> address): every block its own tile."""
        if not callable(allocator):
            raise NkiError("ncc.sbuf.alloc takes a function from block indices to addresses")
        return Buffer("sbuf", True, direct=True)


class _PsumAllocator:
    def mod_alloc(
        self,
        *,
        base_bank: int,
        base_addr: int = 0,
        base_partition: int = 0,
        num_bank_tiles: Sequence[int] = (),
        num_par_tiles: Sequence[int] = (),
        num_free_tiles: Sequence[int] = (),
    ) -> Buffer:
        if base_bank not in range(_PSUM_BANKS):
            raise NkiError(f"ncc.psum.mod_alloc: base_bank {base_bank} is not in 0..7")
        physical = _physical(num_bank_tiles, "ncc.psum.mod_alloc")
        return Buffer("psum", True, base=base_bank, physical_blocks=physical, direct=True)

    def alloc(self, allocator: Callable[..., Any]) -> Buffer:
        if not callable(allocator):
            raise NkiError("ncc.psum.alloc takes a function from block indices to banks")
        return Buffer("psum", True, direct=True)


sbuf = _SbufAllocator()
psum = _PsumAllocator()


def skip_middle_end_transformations(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A compiler directive: nothing to skip here."""
    return fn


def enable_stack_allocator(fn: Callable[..., Any] | None = None, **_: Any) -> Any:
    """A compiler directive: allocation here is always automatic."""
    return fn if fn is not None else (lambda f: f)


force_auto_alloc = enable_stack_allocator
