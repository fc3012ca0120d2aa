"""Fuzz target for collectives and point-to-point traffic of the "neuron" process-group
backend over two ranks.

Both ranks run the same derandomized hypothesis sequence, so they draw the same cases; a
case says what each rank passes (collective, element count, dtype, reduce op, root, group),
and each rank takes its own half. Every case runs on fresh groups with a 2 s timeout, so a
rank left waiting raises instead of hanging. The ranks then exchange outcomes through the
store, and the oracle is checked on both:

- same arguments: both succeed with the CPU's reduction of the two inputs (exactly, inputs
  are small integers), or both raise (e.g. AVG of integers, BAND);
- different arguments: both raise, with a message; where both raised because the backend
  saw the mismatch, the group must still work afterwards (a sum of ones).

Point-to-point cases (send/recv, isend/irecv, batch_isend_irecv) always have equal arguments
on both ranks: a transfer carries no metadata to check, on any backend. The sender drops its
tensor as soon as the send is posted and a new tensor refills the freed block, so a transfer
that does not keep its bytes alive delivers the refill; the receiver must get the sender's
values exactly.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue
import socket
import time
import traceback
from datetime import timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from .fuzz_target import TargetReport, settings_for

CASE_TIMEOUT = timedelta(seconds=2)
DEADLINE_S = 600

POINT_TO_POINT = ("send_recv", "isend_irecv", "batch_isend_irecv")
COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    *POINT_TO_POINT,
)
DTYPES = ("float32", "bfloat16", "float64", "int64", "int32", "uint8", "bool", "complex64")
OPS = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND")


def _side() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({
        "collective": st.sampled_from(COLLECTIVES),
        "numel": st.sampled_from([0, 1, 3, 4, 5, 300_000]),  # 300k: past a socket buffer
        "dtype": st.sampled_from(DTYPES),
        "op": st.sampled_from(OPS),
        "src": st.sampled_from([0, 1, 2, -1]),
        "group": st.sampled_from([0, 1]),
    })  # fmt: skip


def collective_cases() -> st.SearchStrategy[tuple[dict[str, Any], dict[str, Any]]]:
    """(rank 0's arguments, rank 1's): often equal, else differing in one field."""

    def vary(side: dict[str, Any], field: str, other: dict[str, Any]) -> tuple[dict, dict]:
        changed = dict(side)
        changed[field] = other[field]
        return side, changed

    def equal_for_point_to_point(pair: tuple[dict, dict]) -> tuple[dict, dict]:
        first, second = pair
        if first["collective"] in POINT_TO_POINT or second["collective"] in POINT_TO_POINT:
            return first, dict(first)
        return pair

    same = _side().map(lambda s: (s, dict(s)))
    one_differs = st.builds(vary, _side(), st.sampled_from(sorted(_side_fields())), _side()).map(
        equal_for_point_to_point
    )
    return st.one_of(same, one_differs)


def _side_fields() -> set[str]:
    return {"collective", "numel", "dtype", "op", "src", "group"}


def _relevant(side: dict[str, Any]) -> dict[str, Any]:
    """The arguments that matter for this collective."""
    keep = {"collective", "numel", "dtype", "group"}
    if side["collective"] in ("all_reduce", "reduce_scatter_tensor"):
        keep.add("op")
    if side["collective"] in ("broadcast", "send_recv"):
        keep.add("src")
    return {k: v for k, v in side.items() if k in keep}


def _input(numel: int, dtype: Any, rank: int) -> Any:
    """What `rank` contributes: small integers, so every reduction is exact."""
    import torch

    return (torch.arange(numel) % 3 + 1 + rank).to(dtype)


def _run_side(side: dict[str, Any], rank: int, groups: list[Any]) -> Any:
    import torch
    import torch.distributed as dist

    dtype = getattr(torch, side["dtype"])
    n = side["numel"]
    group = groups[side["group"]]
    kind = side["collective"]
    if kind in POINT_TO_POINT:  # takes the only reference to its input, to drop it
        return _run_point_to_point(kind, _input(n, dtype, rank).to("neuron"), side["src"] % 2,
                                   rank, group)  # fmt: skip
    values = _input(n, dtype, rank).to("neuron")
    op = getattr(dist.ReduceOp, side["op"])
    if kind == "all_reduce":
        dist.all_reduce(values, op=op, group=group)
        return values.cpu()
    if kind == "broadcast":
        dist.broadcast(values, src=side["src"], group=group)
        return values.cpu()
    if kind == "all_gather_into_tensor":
        out = torch.empty(2 * n, dtype=dtype, device="neuron")
        dist.all_gather_into_tensor(out, values, group=group)
        return out.cpu()
    full = _input(2 * n, dtype, rank).to("neuron")
    out = torch.empty(n, dtype=dtype, device="neuron")
    dist.reduce_scatter_tensor(out, full, op=op, group=group)
    return out.cpu()


def _run_point_to_point(kind: str, values: Any, sender: int, rank: int, group: Any) -> Any:
    """The received tensor (the sender of send_recv returns its own, which must be intact)."""
    import torch
    import torch.distributed as dist

    peer = 1 - rank
    incoming = torch.empty_like(values)
    works = []
    if rank == 1:
        time.sleep(0.05)  # rank 0's sends are still pending when its refill lands (below)
    if kind == "send_recv":
        if rank == sender:
            dist.send(values, peer, group=group)
            return values.cpu()
        dist.recv(incoming, peer, group=group)
    elif kind == "isend_irecv":
        works = [dist.isend(values, peer, group=group), dist.irecv(incoming, peer, group=group)]
    else:
        works = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, values, peer, group=group),
            dist.P2POp(dist.irecv, incoming, peer, group=group),
        ])  # fmt: skip
    shape, dtype = values.shape, values.dtype
    del values  # the pending send must keep the bytes; the refill below may take the block
    refill = torch.zeros(shape, dtype=dtype, device="neuron")
    torch.neuron.synchronize()
    for work in works:
        work.wait()
    del refill
    return incoming.cpu()


def _reference(side: dict[str, Any], rank: int) -> Any:
    """The result on `rank` computed on the CPU from both ranks' inputs (or raises)."""
    import torch

    dtype = getattr(torch, side["dtype"])
    n = side["numel"]
    inputs = [_input(n, dtype, r) for r in range(2)]
    kind = side["collective"]
    if kind == "send_recv":
        return inputs[side["src"] % 2]  # the receiver's view; the sender keeps its own
    if kind in POINT_TO_POINT:
        return inputs[1 - rank]
    if kind == "broadcast":
        if side["src"] not in (0, 1):
            raise ValueError("invalid root")
        return inputs[side["src"]]
    if kind == "all_gather_into_tensor":
        return torch.cat(inputs)
    if kind == "reduce_scatter_tensor":
        fulls = [_input(2 * n, dtype, r) for r in range(2)]
        inputs = [f[rank * n : (rank + 1) * n] for f in fulls]
    stacked = torch.stack(inputs)
    op = side["op"]
    if op == "BAND" or (op == "AVG" and not dtype.is_floating_point):
        raise ValueError("unsupported op for this dtype")
    if op in ("SUM", "AVG"):
        total = stacked.sum(0, dtype=dtype) if dtype != torch.bool else stacked.any(0)
        return total / 2 if op == "AVG" else total
    if op == "PRODUCT":
        return stacked.prod(0, dtype=dtype) if dtype != torch.bool else stacked.all(0)
    return stacked.amin(0) if op == "MIN" else stacked.amax(0)


def _outcome(side: dict[str, Any], rank: int, groups: list[Any]) -> dict[str, Any]:
    import torch

    try:
        got = _run_side(side, rank, groups)
    except (RuntimeError, ValueError, TypeError, IndexError) as error:
        return {"ok": False, "type": type(error).__name__, "message": str(error)[:400]}
    except Exception as error:  # noqa: BLE001 - reported as a finding by the oracle
        return {"ok": False, "type": type(error).__name__, "message": str(error)[:400],
                "unexpected": True}  # fmt: skip
    try:
        want = _reference(side, rank)
    except (ValueError, RuntimeError) as error:
        return {"ok": True, "matches": False, "why": f"the CPU reference refuses: {error}"}
    same = got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    # values shortened: outcomes travel through the store, whose messages are capped at 8 MiB
    why = f"got {got.flatten()[:8].tolist()}... want {want.flatten()[:8].tolist()}..."
    if not same and got.shape == want.shape and got.dtype == want.dtype:
        why += f" ({int((got != want).sum())} of {got.numel()} elements differ)"
    return {"ok": True, "matches": bool(same), "why": why}


def _check(case: tuple[dict, dict], outcomes: list[dict[str, Any]]) -> str | None:
    """The oracle over both ranks' outcomes: a description of the defect, or None."""
    for r, o in enumerate(outcomes):
        if o.get("unexpected"):
            return f"rank {r} raised an unexpected {o['type']}: {o['message']}"
        if not o["ok"] and not o["message"].strip():
            return f"rank {r} raised {o['type']} with an empty message"
    equal = _relevant(case[0]) == _relevant(case[1])
    if equal:
        if all(o["ok"] for o in outcomes):
            bad = [f"rank {r}: {o['why']}" for r, o in enumerate(outcomes) if not o["matches"]]
            return "; ".join(bad) or None
        if any(o["ok"] for o in outcomes):
            return f"same arguments, but only one rank raised: {outcomes}"
        return None
    ok = [r for r, o in enumerate(outcomes) if o["ok"]]
    if ok:
        return f"mismatched arguments accepted on rank(s) {ok}: {outcomes}"
    return None


def _rank_main(rank: int, port: int, examples: int, verbose: bool, results: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    report: dict[str, Any] = {"cases": 0, "findings": []}
    try:
        import torch
        import torch.distributed as dist

        dist.init_process_group("neuron", rank=rank, world_size=2)
        store = dist.distributed_c10d._get_default_store()

        @settings_for(examples, shrink=False)
        @given(collective_cases())
        def property_(case: tuple[dict, dict]) -> None:
            index = report["cases"]
            report["cases"] += 1
            if verbose:
                print(f"rank {rank} case {index}: {case}", flush=True)
            groups = [dist.new_group([0, 1], timeout=CASE_TIMEOUT) for _ in range(2)]
            mine = _outcome(case[rank], rank, groups)
            store.set(f"fuzz/{index}/{rank}", json.dumps(mine))
            store.wait([f"fuzz/{index}/{1 - rank}"], timedelta(seconds=60))
            theirs = json.loads(store.get(f"fuzz/{index}/{1 - rank}"))
            outcomes = [mine, theirs] if rank == 0 else [theirs, mine]
            defect = _check(case, outcomes)
            both_saw_mismatch = all("do not match" in o.get("message", "") for o in outcomes)
            if defect is None and both_saw_mismatch:
                ones = torch.ones(3, device="neuron")
                dist.all_reduce(ones, group=groups[case[rank]["group"]])
                if ones.cpu().tolist() != [2.0] * 3:
                    defect = f"the group gave {ones.cpu().tolist()} after a detected mismatch"
            for g in groups:
                dist.destroy_process_group(g)
            if defect:
                raise AssertionError(f"case {case}: {defect}")

        try:
            property_()
        except AssertionError as error:
            report["findings"].append(str(error)[:2000])
        _report_and_exit(results, rank, report, 0)
    except BaseException:  # noqa: BLE001 - reported to the parent
        report["findings"].append(traceback.format_exc()[-2000:])
        _report_and_exit(results, rank, report, 1)


def _report_and_exit(results: Any, rank: int, report: dict[str, Any], code: int) -> None:
    results.put((rank, report))
    results.close()
    results.join_thread()  # the queue's feeder thread must flush before os._exit
    os._exit(code)  # groups left waiting by a finding must not block the exit


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_collectives(examples: int, verbose: bool) -> Any:
    started = time.monotonic()
    report = TargetReport("collectives (2 ranks)")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(r, port, examples, verbose, results)) for r in range(2)
    ]
    for p in procs:
        p.start()
    got: dict[int, dict[str, Any]] = {}
    deadline = float(os.environ.get("TORCHNEURON_FUZZ_DEADLINE_S", DEADLINE_S))
    try:
        while len(got) < 2:
            rank, rank_report = results.get(timeout=deadline)
            got[rank] = rank_report
    except queue.Empty:
        report.findings.append(f"ranks {sorted({0, 1} - set(got))} hung ({deadline:.0f} s)")
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
        elif p.exitcode not in (0, 1):
            report.findings.append(f"a rank crashed (exit {p.exitcode})")
    report.cases = min((r["cases"] for r in got.values()), default=0)
    for rank, r in sorted(got.items()):
        report.findings += [f"rank {rank}: {f}" for f in r["findings"]]
    report.seconds = time.monotonic() - started
    return report
