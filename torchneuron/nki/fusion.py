"""Rewrites of a recorded kernel before code generation (the compiled path only).

Three rewrites of Tensor Engine work, all found in tiled-matmul style kernels:

* **PSUM accumulate folding** (exact). ``acc += nc_matmul(a, b)`` records a matmul into a
  fresh PSUM tile and then an add of that tile into ``acc``; when the fresh tile is used
  by nothing else, the pair is one accumulating matmul. The generated code computes the
  same float32 product and the same float32 add, so the result is bit-identical.
* **Contraction chains** (reassociated). The matmuls that accumulate into one PSUM tile,
  whose operands were each DMA'd whole from consecutive row blocks of one HBM tensor
  (``lhs_t[k*128:(k+1)*128, m-block]`` for k = 0, 1, ...), are one matmul over the full
  contraction read straight from HBM: ``lhs_t[0:K, m-block].T @ rhs[0:K, n-block]``. The
  DMAs into the now unread SBUF tiles are dropped. The sum over the contraction is then
  ordered by the host BLAS rather than block by block, so results match the interpreter
  to float32 rounding (relative error ~ K * 2**-24), not bit for bit. Stationary operands
  that are nc_transposes of consecutive column blocks of one tile (attention's P@V) make
  the chain one product of that tile (:func:`fused_matmul_nt_fn`). A zero fill of the
  PSUM tile just before the chain goes too (the sum is stored, not added to zeros).
* **Matmul grids** (reassociated; :mod:`.matmul_grid`, after the rewrites here).
  Consecutive chains writing the blocks ``out[m, n]`` of one output from column blocks m and
  n of the same two HBM tensors over the same contraction rows, the blocks tiling a
  rectangle, are one matmul.

Besides these, :func:`elide_loads` and :func:`store_in_place` drop copies (exact).

Tile contents are not observable outside a kernel, only HBM is; a rewrite applies only
when no step in between touches the tiles and tensors it reorders.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import Any

import numpy as np

from . import dtypes, ops
from .interpreter import Launch, Ref, Step, _identity
from .tiles import resolve_keys


def fused_matmul_fn(x: Any, y: Any) -> Any:
    """A contraction chain's one matmul (marks the Step; the math is nc_matmul's)."""
    return ops.matmul_fn(x, y)


fused_matmul_fn.lowering = ("matmul",)  # type: ignore[attr-defined]


def fused_matmul_nt_fn(x: Any, y: Any) -> Any:
    """A chain over transposed tiles as one matmul: ``x @ y`` where x is the tile whose
    column blocks the chain's stationary operands were transposes of."""
    return ops.matmul_fn(np.ascontiguousarray(np.asarray(x, np.float32).T), y)


fused_matmul_nt_fn.lowering = ("matmul_nt",)  # type: ignore[attr-defined]


def _refs(step: Step) -> list[Ref]:
    return [x for x in step.ins if isinstance(x, Ref)] + [o[0] for o in step.outs]


def _uses(steps: list[Step | None]) -> dict[int, list[int]]:
    uses: dict[int, list[int]] = defaultdict(list)
    for n, step in enumerate(steps):
        if step is None or step.engine == "alloc":
            continue
        for ref in _refs(step):
            if not uses[ref.sid] or uses[ref.sid][-1] != n:
                uses[ref.sid].append(n)
    return uses


def _plain(ref: Ref) -> bool:
    return ref.adv is None


def _whole(ref: Ref) -> bool:
    return ref.adv is None and not ref.keys


def _plain_out(step: Step) -> tuple[Ref, str] | None:
    if len(step.outs) != 1:
        return None
    dst, mask, mode = step.outs[0]
    if mask is not None or not _plain(dst):
        return None
    return dst, mode


def _fold_psum_adds(launch: Launch, steps: list[Step | None]) -> None:
    uses = _uses(steps)
    for n, step in enumerate(steps):
        if step is None or step.fn is not ops.matmul_fn:
            continue
        out = _plain_out(step)
        if out is None or out[1] != "set" or not _whole(out[0]):
            continue
        temp = out[0].sid
        if len(uses[temp]) != 2 or launch.roles[temp][0] != "scratch":
            continue
        if dtypes.name(launch.nki_dtypes[temp]) != "float32":
            continue  # a bfloat16 PSUM tile rounds the product before the add
        m = uses[temp][1]
        add = steps[m]
        if add is None or add.fn is not _identity or m != _next_compute(steps, n):
            continue
        add_out = _plain_out(add)
        src = add.ins[0]
        if add_out is None or add_out[1] != "acc" or not isinstance(src, Ref) or not _whole(src):
            continue
        if src.sid != temp or add_out[0].sid == temp:
            continue
        steps[n] = Step(ops.matmul_fn, step.ins, [(add_out[0], None, "acc")], step.engine)
        steps[m] = None


def _next_compute(steps: list[Step | None], n: int) -> int:
    for m in range(n + 1, len(steps)):
        step = steps[m]
        if step is not None and step.engine != "alloc":
            return m
    return -1


def _row_blocks(sources: list[Ref], axis: int = 0) -> Ref | None:
    """One Ref for the concatenation along view axis `axis` (0: rows, 1: columns) of
    consecutive block views of one tensor: the same key chain but for that axis' slice of
    the last key (integer indices, as in ``v[b, h, rows, :]``, take no view axis), or None."""
    first = sources[0]
    if any(s.sid != first.sid or s.adv is not None for s in sources) or not first.keys:
        return None
    prefix = first.keys[:-1]
    last = first.keys[-1]
    if not isinstance(last, tuple):
        return None
    slices = [n for n, k in enumerate(last) if isinstance(k, slice)]
    if len(slices) <= axis or any(not isinstance(k, (slice, int)) for k in last):
        return None
    at = slices[axis]  # the key position of the view axis the blocks are taken along
    blocks = []
    for s in sources:
        key = s.keys[-1]
        if s.keys[:-1] != prefix or not isinstance(key, tuple) or len(key) != len(last):
            return None
        if any(key[n] != last[n] for n in range(len(last)) if n != at):
            return None
        if not isinstance(key[at], slice) or key[at].step not in (None, 1):
            return None
        blocks.append(key[at])
    for before, after in zip(blocks, blocks[1:], strict=False):
        if before.stop is None or after.start != before.stop:
            return None
    fused = last[:at] + (slice(blocks[0].start, blocks[-1].stop),) + last[at + 1 :]
    return Ref(first.sid, prefix + (fused,), None)


def _loaded_from(
    launch: Launch, steps: list[Step | None], uses: dict[int, list[int]], ref: Ref, at: int
) -> tuple[Ref, int] | None:
    """The HBM view a whole SBUF tile was copied from, if that copy and the matmul at `at`
    are the tile's only uses; with the copy's step index."""
    if not _whole(ref) or launch.roles[ref.sid][0] != "scratch" or len(uses[ref.sid]) != 2:
        return None
    n = uses[ref.sid][0]
    copy = steps[n]
    if copy is None or copy.fn is not _identity or uses[ref.sid][1] != at:
        return None
    out = _plain_out(copy)
    src = copy.ins[0]
    if out is None or out[1] != "set" or not _whole(out[0]) or not isinstance(src, Ref):
        return None
    same_type = launch.nki_dtypes.get(src.sid) == launch.nki_dtypes[ref.sid]
    if not same_type or launch.arrays[ref.sid].dtype != launch.arrays[src.sid].dtype:
        return None  # a converting copy (e.g. float32 -> bfloat16) changes the values
    if launch.roles[src.sid][0] not in ("input", "output") or src.adv is not None:
        return None
    if src.keys and not isinstance(src.keys[-1], tuple):
        return None
    return src, n


def _transposed_from(
    launch: Launch, steps: list[Step | None], uses: dict[int, list[int]], ref: Ref, at: int
) -> tuple[Ref, list[int]] | None:
    """The 2-D float32 tile view whose transpose a whole tile holds (nc_transpose, then
    optionally an exact copy out of PSUM), if those are the tiles' only uses; with the
    transpose's and copy's step indices."""
    found: list[int] = []
    for _ in range(2):
        if not _whole(ref) or launch.roles[ref.sid][0] != "scratch" or len(uses[ref.sid]) != 2:
            return None
        if uses[ref.sid][1] != at or launch.arrays[ref.sid].dtype != np.float32:
            return None
        n = uses[ref.sid][0]
        step = steps[n]
        out = _plain_out(step) if step is not None else None
        if step is None or out is None or out[1] != "set" or not _whole(out[0]):
            return None
        src = step.ins[0] if len(step.ins) == 1 else None
        if not isinstance(src, Ref) or src.adv is not None:
            return None
        found.append(n)
        if step.fn is np.transpose:
            if launch.arrays[src.sid].dtype != np.float32 or dtypes.needs_rounding(
                launch.nki_dtypes[ref.sid]
            ):
                return None
            if resolve_keys(launch.arrays[src.sid], src.keys).ndim != 2:
                return None
            return src, found
        if not _is_copy(step) or dtypes.needs_rounding(launch.nki_dtypes[ref.sid]):
            return None
        ref, at = src, n
    return None


def _fuse_chains(launch: Launch, steps: list[Step | None]) -> list[Step | None]:
    uses = _uses(steps)
    chains: dict[int, list[int]] = defaultdict(list)
    for n, step in enumerate(steps):
        if step is not None and step.fn is ops.matmul_fn:
            out = _plain_out(step)
            if out is not None:
                chains[out[0].sid].append(n)
    result: list[Step | None] = list(steps)
    for dst_sid, members in chains.items():
        for chain in _split_chains(steps, uses, dst_sid, members):
            fused = _fuse_one(launch, steps, uses, chain)
            if fused is None:
                continue
            item, dropped = fused
            for n in chain[:-1] + dropped:
                result[n] = None
            result[chain[-1]] = item
    return result


def _split_chains(
    steps: list[Step | None], uses: dict[int, list[int]], dst_sid: int, members: list[int]
) -> list[list[int]]:
    """Runs of matmuls into the same destination view with no other use of it between."""
    chains: list[list[int]] = []
    current: list[int] = []
    member_set = set(members)
    for n in uses[dst_sid]:
        step = steps[n]
        ok = n in member_set and step is not None
        if ok and current:
            same = step.outs[0][0].keys == steps[current[0]].outs[0][0].keys  # type: ignore[union-attr]
            ok = same and step.outs[0][2] == "acc"  # type: ignore[union-attr]
        if ok:
            current.append(n)
            continue
        if len(current) > 1:
            chains.append(current)
        current = [n] if n in member_set and step is not None else []
    if len(current) > 1:
        chains.append(current)
    return chains


def _fuse_one(
    launch: Launch, steps: list[Step | None], uses: dict[int, list[int]], chain: list[int]
) -> tuple[Step, list[int]] | None:
    head = steps[chain[0]]
    assert head is not None
    if dtypes.name(launch.nki_dtypes[head.outs[0][0].sid]) != "float32":
        return None  # a bfloat16 accumulator rounds after every step: not one matmul
    sources: list[list[Ref]] = [[], []]
    copies: list[int] = []
    transposed = False  # stationary operands are transposes of column blocks of one tile
    for n in chain:
        step = steps[n]
        assert step is not None
        if len(step.ins) != 2:
            return None
        for side in (0, 1):
            found = _loaded_from(launch, steps, uses, step.ins[side], n)
            if found is not None and not (side == 0 and transposed):
                sources[side].append(found[0])
                copies.append(found[1])
                continue
            through = _transposed_from(launch, steps, uses, step.ins[side], n)
            if side != 0 or through is None or (n != chain[0] and not transposed):
                return None
            transposed = True
            sources[side].append(through[0])
            copies.extend(through[1])
    fused = [_row_blocks(sources[0], 1 if transposed else 0), _row_blocks(sources[1])]
    if fused[0] is None or fused[1] is None:
        return None
    # The HBM operands must not change between the first copy and the last matmul.
    start, end = min(copies), chain[-1]
    for sid in {fused[0].sid, fused[1].sid}:
        for n in uses[sid]:
            step = steps[n]
            if start <= n <= end and step is not None and any(o[0].sid == sid for o in step.outs):
                return None
    first = steps[chain[0]]
    assert first is not None
    dst, _, mode = first.outs[0]
    zeroed = _zero_fill_before(launch, steps, uses, dst, chain[0])
    if mode == "acc" and zeroed is not None:
        mode = "set"  # the sum added to zeros is the sum (the fill is dropped)
        copies.append(zeroed)
    fn = fused_matmul_nt_fn if transposed else fused_matmul_fn
    return Step(fn, [fused[0], fused[1]], [(dst, None, mode)], "tensor"), copies


def _zero_fill_before(
    launch: Launch, steps: list[Step | None], uses: dict[int, list[int]], dst: Ref, at: int
) -> int | None:
    """The step that filled all of tile `dst` with zeros just before its use at `at`."""
    if not _whole(dst) or launch.roles[dst.sid][0] != "scratch":
        return None
    seen = uses[dst.sid]
    where = seen.index(at)
    if where == 0:
        return None
    fill = steps[seen[where - 1]]
    if fill is None or getattr(fill.fn, "lowering", None) not in (("fill", 0), ("fill", 0.0)):
        return None
    out = _plain_out(fill)
    if out is None or out[1] != "set" or out[0] != dst:
        return None
    return seen[where - 1]


def _is_copy(step: Step) -> bool:
    """A copy's body: the interpreter's identity, or nl.copy (float32 in, float32 out)."""
    return step.fn is _identity or getattr(step.fn, "lowering", None) == ("unary", "copy")


def plan(launch: Launch, steps: list[Step]) -> list[Step]:
    """The steps to emit, in program order: the recorded ones with the rewrites applied
    (a fused chain is a Step whose fn is :func:`fused_matmul_fn`), without the
    allocations of tiles that no longer appear."""
    work: list[Step | None] = list(steps)
    _fold_psum_adds(launch, work)
    fused = _fuse_chains(launch, work)
    live: set[int] = set()
    for item in fused:
        if item is not None and item.engine != "alloc":
            live.update(ref.sid for ref in _refs(item))
    return [
        item
        for item in fused
        if item is not None and not (item.engine == "alloc" and item.allocated not in live)
    ]


def elide_loads(launch: Launch, steps: list[Step]) -> list[Step]:
    """Tiles that are a plain float32 copy of an HBM input nobody writes, never written
    again, are read from HBM directly: the DMA and the tile's zero fill are dropped (the
    values read are the same; this saves a pass over the data)."""
    written = {o[0].sid for step in steps if step.engine != "alloc" for o in step.outs}
    writes: dict[int, int] = defaultdict(int)
    for step in steps:
        for o in step.outs:
            writes[o[0].sid] += 1
    first_read: dict[int, int] = {}
    for n, step in enumerate(steps):
        for x in step.ins:
            if isinstance(x, Ref):
                first_read.setdefault(x.sid, n)
    source: dict[int, Ref] = {}
    drop: set[int] = set()
    for n, step in enumerate(steps):
        if step.fn is not _identity or len(step.outs) != 1 or len(step.ins) != 1:
            continue
        (src,), (dst, mask, mode) = step.ins, step.outs[0]
        if not isinstance(src, Ref) or mask is not None or mode != "set":
            continue
        if src.adv is not None or dst.adv is not None or dst.keys or writes[dst.sid] != 1:
            continue
        if launch.roles[src.sid][0] != "input" or src.sid in written:
            continue
        if launch.roles[dst.sid][0] != "scratch" or dst.sid in source:
            continue
        if launch.arrays[src.sid].dtype != np.float32 or launch.arrays[dst.sid].dtype != np.float32:
            continue
        if dtypes.needs_rounding(launch.nki_dtypes[dst.sid]):
            continue
        if resolve_keys(launch.arrays[src.sid], src.keys).shape != launch.arrays[dst.sid].shape:
            continue
        if first_read.get(dst.sid, n) < n:
            continue  # read (as zeros) before the load
        source[dst.sid] = src
        drop.add(id(step))
    if not source:
        return steps

    def moved(ref: Ref) -> Ref:
        src = source.get(ref.sid)
        if src is None:
            return ref
        return Ref(src.sid, src.keys + ref.keys, ref.adv, stacked=ref.stacked or src.stacked)

    out: list[Step] = []
    for step in steps:
        if id(step) in drop or (step.engine == "alloc" and step.allocated in source):
            continue
        ins = [moved(x) if isinstance(x, Ref) else x for x in step.ins]
        out.append(dataclasses.replace(step, ins=ins))
    return out


def store_in_place(launch: Launch, steps: list[Step]) -> list[Step]:
    """A float32 tile written whole by one instruction and then only stored (copied) to an
    output is not materialised: the instruction writes the output rows directly (the
    values are the same; this saves a pass over the data). Repeated while it applies, so a
    chain of copies (PSUM -> SBUF -> HBM) ends at its first producer."""
    while True:
        rewritten = _store_in_place_once(launch, steps)
        if rewritten is steps:
            return steps
        steps = rewritten


def _store_in_place_once(launch: Launch, steps: list[Step]) -> list[Step]:
    writers: dict[int, list[int]] = defaultdict(list)
    readers: dict[int, list[int]] = defaultdict(list)
    for n, step in enumerate(steps):
        for x in step.ins:
            if isinstance(x, Ref):
                readers[x.sid].append(n)
        for o in step.outs:
            writers[o[0].sid].append(n)
    redirect: dict[int, tuple[int, Ref]] = {}  # writer step -> (tile sid, output access)
    drop: set[int] = set()
    for n, step in enumerate(steps):
        if not _is_copy(step) or len(step.outs) != 1 or len(step.ins) != 1:
            continue
        (src,), (dst, mask, mode) = step.ins, step.outs[0]
        if not isinstance(src, Ref) or mask is not None or mode != "set" or dst.adv is not None:
            continue
        if launch.roles[dst.sid][0] != "output" or launch.roles[src.sid][0] != "scratch":
            continue
        if src.keys or src.adv is not None or readers[src.sid] != [n]:
            continue
        if len(writers[src.sid]) != 1 or writers[src.sid][0] >= n:
            continue
        producer = writers[src.sid][0]
        if producer in redirect:
            continue
        out = [o for o in steps[producer].outs if o[0].sid == src.sid]
        if len(out) != 1 or out[0][0].keys or out[0][0].adv is not None:
            continue  # not a write of the whole tile
        if out[0][1] is not None or out[0][2] != "set":
            continue
        if launch.arrays[src.sid].dtype != np.float32 or launch.arrays[dst.sid].dtype != np.float32:
            continue
        # a bfloat16 tile rounds what its producer writes: written straight to a float32
        # output instead, the value would skip that rounding
        if dtypes.needs_rounding(launch.nki_dtypes[dst.sid]) or dtypes.needs_rounding(
            launch.nki_dtypes[src.sid]
        ):
            continue
        if resolve_keys(launch.arrays[dst.sid], dst.keys).shape != launch.arrays[src.sid].shape:
            continue
        touched = [m for m in readers[dst.sid] + writers[dst.sid] if producer <= m < n]
        if touched:
            continue  # the output is read or written in between (or by the producer)
        redirect[producer] = (src.sid, Ref(dst.sid, dst.keys, None, stacked=src.stacked))
        drop.add(n)
    if not redirect:
        return steps
    gone = {sid for sid, _ in redirect.values()}
    result: list[Step] = []
    for n, step in enumerate(steps):
        if n in drop or (step.engine == "alloc" and step.allocated in gone):
            continue
        if n in redirect:
            sid, target = redirect[n]
            outs = [(target, m, mode) if o.sid == sid else (o, m, mode) for o, m, mode in step.outs]
            step = dataclasses.replace(step, outs=outs)
        result.append(step)
    return result
