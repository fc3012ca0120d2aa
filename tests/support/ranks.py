"""Spawned ranks of a torch.distributed job, for tests that compare with a CPU/gloo run.

Each rank is a spawned process (the runtime refuses forked children) with one neuron device
(LOCAL_RANK) and one intra-op thread, so a CPU reference and the device run the same
reductions. A rank's error is reported with its traceback; a rank that does not report
within the deadline fails the test instead of hanging CI.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import traceback
from collections.abc import Callable
from typing import Any

import pytest
import torch

DEADLINE_S = 300


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(
    fn: Callable[..., Any], rank: int, size: int, port: int, backend: str, args: tuple, results: Any
) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    try:
        import torch.distributed as dist

        torch.set_num_threads(1)  # the CPU reference and the device run the same reductions
        dist.init_process_group(backend, rank=rank, world_size=size)
        value = fn(rank, size, *args)
        dist.destroy_process_group()
        results.put((rank, "ok", value))
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the test
        results.put((rank, "error", traceback.format_exc()))


def run_ranks(fn: Callable[..., Any], size: int, backend: str, *args: Any) -> dict[int, Any]:
    """fn(rank, size, *args) in `size` spawned processes under `backend`; rank -> value."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_entry, args=(fn, r, size, port, backend, args, results))
        for r in range(size)
    ]
    for p in procs:
        p.start()
    got: dict[int, tuple[str, Any]] = {}
    try:
        while len(got) < size:
            rank, status, value = results.get(timeout=DEADLINE_S)
            got[rank] = (status, value)
    except queue.Empty:
        pytest.fail(f"ranks {sorted(set(range(size)) - set(got))} did not report in {DEADLINE_S} s")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    errors = {r: v for r, (s, v) in got.items() if s != "ok"}
    assert not errors, "\n".join(f"rank {r}:\n{v}" for r, v in errors.items())
    return {r: v for r, (_, v) in got.items()}
