"""Matmul grids (the compiled path only; run after :mod:`.fusion`'s rewrites).

A tiled matmul computes each block ``out[m, n]`` of its output as a contraction chain, which
:mod:`.fusion` makes one matmul per block. Consecutive such matmuls, reading column blocks m
and n of the same two HBM tensors over the same contraction rows, whose blocks tile a
rectangle of the output, are one matmul over the rectangle: the kernel's (m, n) loops become
one host GEMM. Sums are reassociated as in a chain (float32 rounding).
"""

from __future__ import annotations

from typing import Any

from .fusion import fused_matmul_fn
from .interpreter import Launch, Ref, Step


def merge_matmul_grid(launch: Launch, steps: list[Step]) -> list[Step]:
    """Consecutive contraction chains, each writing one block of an output from column
    blocks of the same two HBM tensors over the same contraction rows
    (``out[m, n] = lhs_t[k, m].T @ rhs[k, n]``), whose blocks tile a rectangle of the output,
    are one matmul over that rectangle: a tiled matmul's (m, n) loops become one host GEMM.
    Sums are reassociated as in a chain (float32 rounding); allocations between them move
    ahead of it (they touch none of its tensors)."""
    result: list[Step] = []
    n = 0
    while n < len(steps):
        run = _grid_run(launch, steps, n)
        merged = _merged(launch, [steps[i] for i in run]) if len(run) > 1 else None
        if merged is None:
            result.append(steps[n])
            n += 1
            continue
        end = run[-1] + 1
        result.extend(steps[i] for i in range(n, end) if i not in run)  # allocations
        result.append(merged)
        n = end
    return result


def _grid_run(launch: Launch, steps: list[Step], start: int) -> list[int]:
    """Indices of the chains from `start` on with one signature (allocations skipped)."""
    first = _chain_signature(launch, steps[start])
    run: list[int] = []
    for n in range(start, len(steps)):
        step = steps[n]
        if step.engine == "alloc" and run:
            continue
        if first is None or _chain_signature(launch, step) != first:
            break
        run.append(n)
    return run


def _chain_signature(launch: Launch, step: Step) -> tuple[Any, ...] | None:
    """(lhs, rhs, out, contraction rows) of a chain writing an HBM output block, or None."""
    if step.fn is not fused_matmul_fn or len(step.outs) != 1 or len(step.ins) != 2:
        return None
    dst, mask, mode = step.outs[0]
    if mask is not None or mode != "set" or launch.roles[dst.sid][0] != "output":
        return None
    blocks = [_block(launch, x) for x in (*step.ins, dst)]
    if any(b is None for b in blocks):
        return None
    lhs, rhs = step.ins
    if dst.sid in (lhs.sid, rhs.sid) or blocks[0][0] != blocks[1][0]:  # type: ignore[index]
        return None
    return lhs.sid, rhs.sid, dst.sid, blocks[0][0]  # type: ignore[index]


def _block(launch: Launch, ref: Any) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """(rows, columns) of a 2-D tensor's one basic-slice view, as [start, stop) pairs."""
    if not isinstance(ref, Ref) or ref.adv is not None or ref.stacked or len(ref.keys) != 1:
        return None
    key, array = ref.keys[0], launch.arrays[ref.sid]
    if not isinstance(key, tuple) or len(key) != 2 or array.ndim != 2:
        return None
    if not all(isinstance(k, slice) and k.step in (None, 1) for k in key):
        return None
    rows, cols = (k.indices(size)[:2] for k, size in zip(key, array.shape, strict=True))
    return rows, cols


def _merged(launch: Launch, chains: list[Step]) -> Step | None:
    ms: set[tuple[int, int]] = set()
    ns: set[tuple[int, int]] = set()
    pairs: set[tuple[tuple[int, int], tuple[int, int]]] = set()
    for step in chains:
        lhs, rhs, dst = (_block(launch, x) for x in (*step.ins, step.outs[0][0]))
        assert lhs is not None and rhs is not None and dst is not None
        if dst != (lhs[1], rhs[1]):
            return None  # the block is not the product of those columns
        ms.add(lhs[1])
        ns.add(rhs[1])
        pairs.add(dst)
    if len(pairs) != len(chains) or len(pairs) != len(ms) * len(ns):
        return None
    m_span, n_span = _contiguous(ms), _contiguous(ns)
    if m_span is None or n_span is None:
        return None
    head = chains[0]
    lhs, rhs = head.ins
    dst = head.outs[0][0]
    k_rows = slice(*_block(launch, lhs)[0])  # type: ignore[index]
    return Step(
        fused_matmul_fn,
        [
            Ref(lhs.sid, ((k_rows, slice(*m_span)),), None),
            Ref(rhs.sid, ((k_rows, slice(*n_span)),), None),
        ],
        [(Ref(dst.sid, ((slice(*m_span), slice(*n_span)),), None), None, "set")],
        "tensor",
    )


def _contiguous(ranges: set[tuple[int, int]]) -> tuple[int, int] | None:
    ordered = sorted(ranges)
    if any(a[1] != b[0] for a, b in zip(ordered, ordered[1:], strict=False)):
        return None
    return ordered[0][0], ordered[-1][1]
