"""Ranks of a torch.distributed job in fresh processes, for tests that compare with a CPU/gloo run.

Each rank is a process of its own with one neuron device (LOCAL_RANK) and one intra-op
thread, so a CPU reference and the device run the same reductions. A rank's error is reported
with its traceback; a rank that does not report within the deadline fails the test instead of
hanging CI.

Ranks are forked from a multiprocessing fork server that has imported torch and never touched
the device (the runtime refuses children forked after its initialisation, and a fork server's
children are not): a spawned interpreter spends ~2 CPU-s importing torch, which on two cores
is most of what a small distributed test costs. A rank reads the environment the fork server
started with, so once a test has changed the environment since then, its ranks are spawned.
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.forkserver as forkserver
import os
import queue
import socket
import traceback
from collections.abc import Callable
from typing import Any

import pytest
import torch

DEADLINE_S = 300

# Read by each rank itself, not at import: they may differ from the fork server's.
_PER_RANK_VARIABLES = {"MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "PYTEST_CURRENT_TEST"}
_fork_server_environment: dict[str, str] | None = None


def _launch_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _PER_RANK_VARIABLES}


def rank_context() -> Any:
    """The multiprocessing context to start ranks with: the fork server (torch imported) while
    the environment is the one it started with, else spawn (a fresh interpreter reads it)."""
    global _fork_server_environment
    if _fork_server_environment is None:
        if getattr(forkserver._forkserver, "_forkserver_pid", None) is not None:
            return mp.get_context("spawn")  # started elsewhere, with an environment unknown here
        _fork_server_environment = _launch_environment()
        context = mp.get_context("forkserver")
        context.set_forkserver_preload(["torch", "torch.distributed"])
        return context
    if _launch_environment() == _fork_server_environment:
        return mp.get_context("forkserver")
    return mp.get_context("spawn")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_entry(
    fn: Callable[..., Any],
    rank: int,
    size: int,
    port: int,
    results: Any,
    backend: str = "neuron",
    args: tuple = (),
    group_timeout_s: float | None = None,
) -> None:
    """One rank: joins the group, runs fn(rank, size, *args), puts (rank, "ok"|"error", value).

    The group's timeout is set at the first init: re-initialising on the same port races the
    old store's shutdown (a rank can join the old server just before rank 0 closes it)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    try:
        import datetime

        import torch.distributed as dist

        torch.set_num_threads(1)  # the CPU reference and the device run the same reductions
        timeout = None if group_timeout_s is None else datetime.timedelta(seconds=group_timeout_s)
        dist.init_process_group(backend, rank=rank, world_size=size, timeout=timeout)
        value = fn(rank, size, *args)
        if dist.is_initialized():
            dist.destroy_process_group()
        results.put((rank, "ok", value))
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the test
        results.put((rank, "error", traceback.format_exc()))


def run_ranks(
    fn: Callable[..., Any], size: int, backend: str = "neuron", *args: Any
) -> dict[int, Any]:
    """fn(rank, size, *args) in `size` fresh processes under `backend`; rank -> value."""
    ctx = rank_context()
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=rank_entry, args=(fn, r, size, port, results, backend, args))
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
