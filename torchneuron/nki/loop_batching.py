"""Loop batching (the compiled path only): an ``affine_range`` loop whose iterations repeat
the same row-wise instructions over tiles stacked along the partition axis runs as one
call per instruction over all iterations' rows.

A traced loop records each iteration's steps (``Step.loops``). A loop is batched when

* every iteration has the same steps: the same instruction body (the same function, or
  the same code over equal captured values), the same constants, no mask (or an all-true
  one), no affine-expression (advanced) index, and a body marked ``ops.row_wise`` (each
  output row depends only on the same input row: no matmul, transpose, partition reduce);
* every tile access is one of: a tile allocated in the iteration and used only there
  (all iterations' tiles become one scratch array of iterations x rows); an HBM access
  whose rows move by exactly its row count per iteration (``x[t*128:(t+1)*128, :]``: the
  stacked access is one slice over every iteration's rows); or the same access in every
  iteration, never written in the loop (read as is, or row-split to broadcast);
* HBM written in the loop is not read in it and is written by one instruction.

Iterations of an affine_range are independent by definition, and the checks above make
running step k of every iteration before step k+1 the same computation: elementwise
results are bit-identical, and row reductions reduce the same row with the same numpy
loop (tested bit for bit against the interpreter).
"""

from __future__ import annotations

import types
from collections import defaultdict
from typing import Any

import numpy as np

from .interpreter import Launch, Ref, Step, _zeros
from .tiles import _ids, resolve_keys


def _same_value(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))
    if isinstance(a, types.FunctionType):
        return _same_fn(a, b)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b, strict=True))
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001  (incomparable values are different)
        return False


def _same_fn(f: Any, g: Any) -> bool:
    if f is g:
        return True
    if not isinstance(f, types.FunctionType) or not isinstance(g, types.FunctionType):
        return False
    if f.__code__ is not g.__code__ or not _same_value(f.__defaults__, g.__defaults__):
        return False
    cells_f, cells_g = f.__closure__ or (), g.__closure__ or ()
    return len(cells_f) == len(cells_g) and all(
        _same_value(x.cell_contents, y.cell_contents) for x, y in zip(cells_f, cells_g, strict=True)
    )


def _full_rows(item: Any, rows: int) -> bool:
    if not isinstance(item, slice) or item.step not in (None, 1):
        return False
    return item.indices(rows)[:2] == (0, rows)


def _refs(step: Step) -> list[Ref]:
    return [x for x in step.ins if isinstance(x, Ref)] + [o[0] for o in step.outs]


def _all_true(mask: Any) -> bool:
    return mask is None or bool(np.all(np.asarray(mask, dtype=bool)))


class _Group:
    """One loop's iterations being matched against iteration 0."""

    def __init__(
        self,
        launch: Launch,
        iterations: list[list[Step]],
        uses: dict[int, set[int]],
        loop: list[list[Step]],
    ) -> None:
        self.launch = launch
        self.iterations = iterations  # the iterations batched together (a chunk of `loop`)
        self.uses = uses
        self.count = len(iterations)
        self.rows: int | None = None  # partition rows per iteration
        self.local: list[dict[int, int]] = []  # per iteration: sid -> alloc position
        self.stacked_sid: dict[int, int] = {}  # iteration-0 local sid -> stacked sid
        self.written: set[int] = set()  # over the whole loop, not just this chunk
        self.read: set[int] = set()
        self.hbm_writers: dict[int, int] = {}
        for it in loop:
            for step in it:
                if step.engine != "alloc":
                    self.read.update(x.sid for x in step.ins if isinstance(x, Ref))
                    self.written.update(o[0].sid for o in step.outs)

    def _view(self, ref: Ref) -> np.ndarray:
        return resolve_keys(self.launch.arrays[ref.sid], ref.keys)

    def _set_rows(self, rows: int) -> bool:
        if self.rows is None:
            self.rows = rows
        return self.rows == rows

    def build(self) -> list[Step] | None:
        first = self.iterations[0]
        if any(len(it) != len(first) for it in self.iterations):
            return None
        for it in self.iterations:
            self.local.append(
                {s.allocated: n for n, s in enumerate(it) if s.engine == "alloc" and s.allocated}
            )
            ids = {id(s) for s in it}
            for sid in self.local[-1]:
                if not self.uses[sid] <= ids:
                    return None  # an iteration's tile used outside its iteration
        out: list[Step] = []
        for k, step in enumerate(first):
            batched = self._step(k, step)
            if batched is None:
                return None
            out.append(batched)
        return out

    def _step(self, k: int, step: Step) -> Step | None:
        steps = [it[k] for it in self.iterations]
        if any(s.engine != step.engine for s in steps):
            return None
        if step.engine == "alloc":
            return self._alloc(step)
        if not getattr(step.fn, "row_wise", False) or step.fn is _zeros:
            return None
        for s in steps[1:]:
            if not _same_fn(s.fn, step.fn) or len(s.ins) != len(step.ins):
                return None
            if len(s.outs) != len(step.outs):
                return None
            for x, y in zip(s.ins, step.ins, strict=True):
                if isinstance(x, Ref) != isinstance(y, Ref):
                    return None
                if not isinstance(x, Ref) and not _same_value(x, y):
                    return None
            if any(o[2] != p[2] for o, p in zip(s.outs, step.outs, strict=True)):
                return None
        if not all(_all_true(o[1]) for s in steps for o in s.outs):
            return None
        ins: list[Any] = []
        for n, x in enumerate(step.ins):
            if isinstance(x, Ref):
                ref = self._access([s.ins[n] for s in steps], written=False)
                if ref is None:
                    return None
                ins.append(ref)
            else:
                ins.append(x)
        outs = []
        for n, (_, _, mode) in enumerate(step.outs):
            ref = self._access([s.outs[n][0] for s in steps], written=True, position=k)
            if ref is None or not ref.stacked:
                return None  # every iteration writes its own rows
            outs.append((ref, None, mode))
        assert self.rows is not None
        return Step(step.fn, ins, outs, step.engine, batch=(self.count, self.rows))

    def _alloc(self, step: Step) -> Step | None:
        sid = step.allocated
        assert sid is not None
        template = self.launch.arrays[sid]
        storage_rows = template.shape[0] if template.ndim else 0
        if not template.ndim or not self._set_rows(storage_rows):
            return None
        for it, local in zip(self.iterations, self.local, strict=True):
            if list(local.values()) != list(self.local[0].values()):
                return None
            other = it[self.local[0][sid]].allocated
            assert other is not None
            if self.launch.arrays[other].shape != template.shape:
                return None
        stacked = next(_ids)
        shape = (self.count * storage_rows,) + template.shape[1:]
        self.launch.roles[stacked] = ("scratch", -1)
        self.launch.arrays[stacked] = np.broadcast_to(np.zeros((), template.dtype), shape)
        self.launch.nki_dtypes[stacked] = self.launch.nki_dtypes[sid]
        self.stacked_sid[sid] = stacked
        return Step(_zeros, [], [], "alloc", stacked)

    def _access(self, refs: list[Ref], written: bool, position: int = -1) -> Ref | None:
        first = refs[0]
        if any(r.adv is not None for r in refs):
            return None
        if first.sid in self.local[0]:
            return self._local(refs)
        if all(r.sid == first.sid for r in refs) and all(
            _same_value(r.keys, first.keys) for r in refs
        ):
            if first.sid in self.written:
                return None  # the same tile or tensor written by every iteration
            return first
        if self.launch.roles[first.sid][0] not in ("input", "output"):
            return None
        if any(r.sid != first.sid for r in refs) or first.sid in self.read and written:
            return None
        if written:
            if self.hbm_writers.setdefault(first.sid, position) != position:
                return None
        return self._hbm_rows(refs)

    def _local(self, refs: list[Ref]) -> Ref | None:
        first = refs[0]
        order = self.local[0][first.sid]
        for r, local in zip(refs, self.local, strict=True):
            if local.get(r.sid) != order or not _same_value(r.keys, first.keys):
                return None
        rows = self.launch.arrays[first.sid].shape[0]
        for key in first.keys:
            if not isinstance(key, tuple) or not key or key[0] == "reshape":
                return None
            if not _full_rows(key[0], rows):
                return None
        keys = tuple((slice(None),) + key[1:] for key in first.keys)
        return Ref(self.stacked_sid[first.sid], keys, None, stacked=True)

    def _hbm_rows(self, refs: list[Ref]) -> Ref | None:
        first = refs[0]
        if not first.keys or any(len(r.keys) != len(first.keys) for r in refs):
            return None
        if any(not _same_value(r.keys[:-1], first.keys[:-1]) for r in refs):
            return None
        last = first.keys[-1]
        if not isinstance(last, tuple) or last[:1] == ("reshape",):
            return None
        axis = next((a for a, item in enumerate(last) if not isinstance(item, int)), None)
        if axis is None or not isinstance(last[axis], slice):
            return None
        view = self._view(first)
        rows = view.shape[0] if view.ndim else 0
        if not self._set_rows(rows) or rows == 0:
            return None
        start = last[axis].start or 0
        for n, r in enumerate(refs):
            key = r.keys[-1]
            if not isinstance(key, tuple) or len(key) != len(last):
                return None
            if not _same_value(key[:axis] + key[axis + 1 :], last[:axis] + last[axis + 1 :]):
                return None
            item = key[axis]
            if not isinstance(item, slice) or item.step not in (None, 1):
                return None
            if item.start != start + n * rows or self._view(r).shape[0] != rows:
                return None
        whole = slice(start, start + self.count * rows)
        keys = first.keys[:-1] + (last[:axis] + (whole,) + last[axis + 1 :],)
        if resolve_keys(self.launch.arrays[first.sid], keys).shape[0] != self.count * rows:
            return None
        return Ref(first.sid, keys, None, stacked=True)


def _uses(steps: list[Step]) -> dict[int, set[int]]:
    uses: dict[int, set[int]] = defaultdict(set)
    for step in steps:
        for ref in _refs(step):
            uses[ref.sid].add(id(step))
        if step.allocated is not None:
            uses[step.allocated].add(id(step))
    return uses


def batch_loops(launch: Launch, steps: list[Step], chunk_bytes: int | None = None) -> list[Step]:
    """The steps with every batchable affine_range loop replaced by its batched steps
    (outermost loops first; a loop that cannot be batched has its inner loops tried).
    Iterations are batched in chunks of about `chunk_bytes` (CHUNK_BYTES by default) of
    tile rows; 0 batches a whole loop at once (row programs keep rows in L1 themselves)."""
    size = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    return _batch(launch, steps, 0, _uses(steps), size)


# Iterations batched per call: enough rows that per-call overhead is small, few enough
# that one instruction's stacked tiles stay in the core's L2 cache between instructions.
CHUNK_BYTES = 1 << 20


def _chunks(
    launch: Launch, iterations: list[list[Step]], uses: dict[int, set[int]], chunk_bytes: int
) -> list[Step] | None:
    tile_bytes = max(
        (launch.arrays[s.allocated].nbytes for s in iterations[0] if s.allocated is not None),
        default=1,
    )
    size = (
        len(iterations)
        if chunk_bytes == 0
        else max(1, min(len(iterations), chunk_bytes // max(tile_bytes, 1)))
    )
    out: list[Step] = []
    for start in range(0, len(iterations), size):
        chunk = iterations[start : start + size]
        batched = _Group(launch, chunk, uses, iterations).build() if len(chunk) > 1 else chunk[0]
        if batched is None:
            return None
        out.extend(batched)
    return out


def _batch(
    launch: Launch, steps: list[Step], depth: int, uses: dict[int, set[int]], chunk_bytes: int
) -> list[Step]:
    out: list[Step] = []
    n = 0
    while n < len(steps):
        step = steps[n]
        if len(step.loops) <= depth:
            out.append(step)
            n += 1
            continue
        loop = step.loops[depth][0]
        end = n
        while (
            end < len(steps)
            and len(steps[end].loops) > depth
            and steps[end].loops[depth][0] == loop
        ):
            end += 1
        run = steps[n:end]
        iterations: list[list[Step]] = []
        for s in run:
            index = s.loops[depth][1]
            if index == len(iterations):
                iterations.append([])
            elif index != len(iterations) - 1:
                iterations = []
                break
            iterations[-1].append(s)
        batched = _chunks(launch, iterations, uses, chunk_bytes) if len(iterations) > 1 else None
        out.extend(
            batched if batched is not None else _batch(launch, run, depth + 1, uses, chunk_bytes)
        )
        n = end
    return out
