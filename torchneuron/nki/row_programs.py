"""Row programs: runs of row-wise instructions compiled to one C++ loop over partition rows.

The numpy program (:mod:`.codegen`) runs one numpy call per instruction over whole tiles
(a loop's iterations stacked, :mod:`.loop_batching`): each call is a pass over memory with
temporaries. Most of a normalisation or softmax kernel, though, is a chain of instructions
whose every output row depends only on the same row of their inputs. Such a run becomes one
C++ function::

    for (long r = 0; r < rows; ++r) { instruction 1 on row r; instruction 2 on row r; ... }

so a row's values stay in the core's L1 cache from the first instruction to the last, and
the per-call overhead is one ctypes call for the run. Running row by row instead of
instruction by instruction is only valid when no instruction of the run reads a row that
another one writes at a different position: :class:`_Run` admits an instruction only if every
array the run writes is accessed with one row geometry throughout.

What is lowered: float32 tiles (no rounding to narrower types on write), no masks, no
advanced indexing, and the bodies that carry a ``lowering`` description (copies and DMAs,
broadcasts, nl/nisa elementwise math, free-axis reductions and means, activation with
scale/bias/reduce, tensor_scalar, bn_stats/bn_aggr, softmax, fills, transposes and
matmuls). Everything else stays numpy. HBM is addressed by element offsets compiled in: the
kernel cache keys on the arrays' strides, so every call of a program has its layout.
Results agree with the interpreter to float32 rounding (sums are reassociated, exp is a
polynomial), not bit for bit; ``TORCHNEURON_NKI_ROW_PROGRAMS=never`` turns this off.
"""

from __future__ import annotations

import ctypes
import os
import re
import warnings
from typing import Any

import numpy as np

from . import row_cxx
from .interpreter import Launch, Ref, Step
from .row_lowering import NotLowerable, StepLowering
from .row_views import POINTER, Tables, View

VARIABLE = "TORCHNEURON_NKI_ROW_PROGRAMS"
# Below this many elements over all runs, the numpy calls are cheap and a compile is not
# worth it.
MIN_ELEMENTS = 1 << 16
LOCAL_LIMIT = 16384  # floats per row in a row-local buffer (on the stack)
# A run this large runs its rows on all intra-op threads: an OpenMP region costs a few us,
# a 2^15-element run ~15 us on one thread (an SPMD grid's instances are runs of this size).
PARALLEL_ELEMENTS = 1 << 15


def mode() -> str:
    value = os.environ.get(VARIABLE, "auto")
    if value not in ("auto", "always", "never"):
        raise ValueError(f"{VARIABLE}={value!r}: use 'auto', 'always' or 'never'")
    return value


class _Run:
    """A run of consecutive lowerable steps over the same rows, and its C++ body."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.lines: list[str] = []
        self.steps: list[Step] = []
        self.elements = 0
        # per array slot written in the run: (row stride, first row offset) all accesses share
        self.geometry: dict[int, tuple[int, int]] = {}
        self.reads: list[tuple[View, str]] = []
        self.writes: list[View] = []
        self.indices: list[int] = []  # positions of its steps in the step list

    @staticmethod
    def _row_origin(v: View) -> tuple[int, int] | None:
        """(row stride, offset of the first row's start) of a view whose rows each lie
        within one row of its array; None for any other view (never admitted as written)."""
        if v.row_stride < 0 or v.col_stride < 0:
            return None
        if v.row_stride == 0:
            return (0, v.offset) if v.rows == 1 else None
        within = v.offset % v.row_stride
        if within + (v.free - 1) * v.col_stride >= v.row_stride:
            return None
        return (v.row_stride, v.offset - within)

    def admits(self, reads: list[tuple[View, str]], writes: list[View]) -> bool:
        geometry = dict(self.geometry)
        for v in writes:
            origin = self._row_origin(v)
            if origin is None or geometry.setdefault(v.slot, origin) != origin:
                return False
        for v, row in [*self.reads, *reads]:
            if v.slot in geometry and (row != "r" or self._row_origin(v) != geometry[v.slot]):
                return False
        self.geometry = geometry
        self.reads.extend(reads)
        self.writes.extend(writes)
        return True

    def locals(self, launch: Launch, uses: dict[int, set[int]]) -> dict[int, tuple[int, int]]:
        """Scratch tiles only this run uses, each row read where it was written: they live
        in a buffer per row (L1) instead of memory. sid -> (row origin offset, floats)."""
        mine = set(self.indices)
        found: dict[int, tuple[int, int]] = {}
        refused: set[int] = set()
        for v, row in [*self.reads, *[(w, "r") for w in self.writes]]:
            if v.sid in refused:
                continue
            origin = self._row_origin(v)
            if (
                launch.roles[v.sid][0] != "scratch"
                or not uses.get(v.sid, set()) <= mine
                or row != "r"
                or origin is None
            ):
                refused.add(v.sid)
                continue
            extent = v.offset - origin[1] + (v.free - 1) * max(v.col_stride, 0) + 1
            start, size = found.get(v.sid, (origin[1], 0))
            if start != origin[1] or extent > LOCAL_LIMIT:
                refused.add(v.sid)
                continue
            found[v.sid] = (start, max(size, extent))
        return {sid: found[sid] for sid in found if sid not in refused}


class RowPrograms:
    """Finds the runs of a step list, writes their C++ and links it."""

    def __init__(
        self, launch: Launch, slot_of: dict[int, np.ndarray], n_inputs: int, n_outputs: int
    ) -> None:
        self.launch = launch
        self.tables = Tables(launch, slot_of, n_inputs + n_outputs)
        self.steps = StepLowering(launch, self.tables, n_inputs)
        self.runs: list[_Run] = []
        self.uses: dict[int, set[int]] = {}

    def plan(self, steps: list[Step], covered: set[int]) -> list[tuple[str, Any]]:
        """The steps in program order as ("step", step) for numpy or ("run", n) for C++ run n."""
        items: list[tuple[str, Any]] = []
        run: _Run | None = None

        def close() -> None:
            nonlocal run
            if run is not None:
                self.runs.append(run)
                items.append(("run", len(self.runs) - 1))
            run = None

        self.uses = _uses(steps, covered)
        for index, step in enumerate(steps):
            if step.engine == "alloc" and (step.allocated is None or step.allocated in covered):
                continue  # nothing to do: the tile's first write covers it
            try:
                rows, lines, reads, writes = (
                    self.steps.fill(step) if step.engine == "alloc" else self.steps.lower(step)
                )
            except NotLowerable:
                close()
                items.append(("step", step))
                continue
            if run is not None and (run.rows != rows or not run.admits(reads, writes)):
                close()
            if run is None:
                run = _Run(rows)
                if not run.admits(reads, writes):
                    run = None
                    items.append(("step", step))
                    continue
            run.lines.extend(lines)
            run.steps.append(step)
            run.indices.append(index)
            run.elements += rows * max(v.free for v in writes)
        close()
        if mode() != "always" and sum(r.elements for r in self.runs) < MIN_ELEMENTS:
            self.runs = []  # too little work for a compile: the numpy program
            return [("step", step) for step in steps]
        return items

    def source(self) -> str:
        size = self.tables.n_hbm + len(self.tables.scratch_arrays)
        parts = [row_cxx.PRELUDE]
        for n, run in enumerate(self.runs):
            local = run.locals(self.launch, self.uses)

            def address(match: re.Match[str], local: dict[int, tuple[int, int]] = local) -> str:
                sid, slot, offset, stride, row = match.groups()
                if int(sid) in local:
                    return f"L{sid} + {int(offset) - local[int(sid)][0]}"
                return f"A{slot} + {offset} + (long)({row}) * {stride}"

            parts.append(f'extern "C" void run{n}(void** p) {{')
            parts.extend(f"  float* const A{k} = static_cast<float*>(p[{k}]);" for k in range(size))
            if run.elements >= PARALLEL_ELEMENTS:
                # rows are independent by construction (Run.admits): split them over torch's
                # intra-op threads (the same libgomp, so the same pool and thread count)
                parts.append("  #pragma omp parallel for schedule(static)")
            parts.append(f"  for (long r = 0; r < {run.rows}; ++r) {{")
            parts.extend(f"    float L{sid}[{extent}];" for sid, (_, extent) in local.items())
            parts.extend(f"    {POINTER.sub(address, line)}" for line in run.lines)
            parts.append("  }")
            parts.append("}")
        return "\n".join(parts) + "\n"

    def link(self) -> Linked:
        from . import cxx_build

        lib = cxx_build.load(self.source())
        return Linked(lib, len(self.runs), self.tables.n_hbm, self.tables.scratch_arrays)


class Linked:
    """A compiled set of runs: the pointer table and one callable per run."""

    def __init__(self, lib: ctypes.CDLL, runs: int, n_hbm: int, scratch: list[np.ndarray]):
        self.n_hbm = n_hbm
        self.scratch = scratch  # kept alive: the table holds their addresses
        self.table = (ctypes.c_void_p * (n_hbm + len(scratch)))()
        for n, array in enumerate(scratch):
            self.table[n_hbm + n] = array.__array_interface__["data"][0]
        self.functions = []
        for n in range(runs):
            fn = getattr(lib, f"run{n}")
            fn.argtypes = [ctypes.c_void_p]
            fn.restype = None
            self.functions.append(fn)

    def fill(self, *arrays: np.ndarray) -> None:
        """Puts this call's HBM arrays in the table (the kernel cache keys on their shapes
        and strides, so the offsets compiled in hold for them)."""
        table = self.table
        for n, array in enumerate(arrays):
            table[n] = array.__array_interface__["data"][0]


def warn_unavailable(reason: Exception) -> None:
    warnings.warn(
        f"NKI row programs run as numpy ({reason}); set {VARIABLE}=never to silence this",
        RuntimeWarning,
        stacklevel=3,
    )


def _uses(steps: list[Step], covered: set[int]) -> dict[int, set[int]]:
    """sid -> positions of the steps that touch it (allocations of covered tiles do not)."""
    uses: dict[int, set[int]] = {}
    for n, step in enumerate(steps):
        if step.engine == "alloc" and step.allocated in covered:
            continue
        sids = [x.sid for x in step.ins if isinstance(x, Ref)] + [o[0].sid for o in step.outs]
        if step.allocated is not None:
            sids.append(step.allocated)
        for sid in sids:
            uses.setdefault(sid, set()).add(n)
    return uses
