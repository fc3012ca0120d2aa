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
import runpy
import socket
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

DEADLINE_S = 300

# Read by each rank itself, not at import: they may differ from the fork server's.
_PER_RANK_VARIABLES = {"MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "PYTEST_CURRENT_TEST"}
_fork_server_environment: dict[str, str] | None = None
# What the fork server imports once for all its ranks: torch and the distributed packages the
# ranks and examples import (~1 CPU-s a rank otherwise).
_PRELOAD = [
    "torch",
    "torch.distributed",
    "torch.distributed.tensor",
    "torch.distributed.pipelining",
    "torch.distributed.checkpoint",
    "torch.distributed.fsdp",
]


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
        context.set_forkserver_preload(_PRELOAD)
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


def _script_rank(
    script: str, argv: list[str], env: dict[str, str], output: Path, rank: int
) -> None:
    """One rank of `run_script`: torchrun's environment, stdout and stderr to files, the script
    run as __main__; the process exits with the script's status."""
    with open(output / f"{rank}.out", "w") as out, open(output / f"{rank}.err", "w") as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
    os.environ.update(env)
    torch.set_num_threads(int(env["OMP_NUM_THREADS"]))  # read at import by a fresh interpreter
    sys.argv = [script, *argv]
    sys.path.insert(0, str(Path(script).parent))  # as `python script` puts it
    status: int | str | None = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        status = exit_.code
    except BaseException:  # noqa: BLE001 - the traceback goes to the rank's stderr
        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status if isinstance(status, int) else (0 if status is None else 1))


def run_script(script: str | Path, argv: list[str], nproc: int, output: Path, **env: str) -> str:
    """`torchrun --standalone --nproc-per-node nproc script *argv` with `env` added, its ranks
    forked from the fork server (torch and its distributed packages imported once) rather than
    started as fresh interpreters: each rank gets the variables torchrun sets (RANK, LOCAL_RANK,
    WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT; OMP_NUM_THREADS=1 for more than one
    rank) and runs the script as __main__.
    Returns the ranks' standard output in rank order; fails the test with every rank's output
    unless all exit 0 within the deadline. Tests of torchrun itself run torchrun."""
    ctx = rank_context()
    port = free_port()
    output.mkdir(parents=True, exist_ok=True)
    common = dict(env, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(nproc))
    common.update(LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK="0", TORCHELASTIC_RUN_ID="none")
    common.setdefault("OMP_NUM_THREADS", "1" if nproc > 1 else str(torch.get_num_threads()))
    procs = []
    for rank in range(nproc):
        rank_env = dict(common, RANK=str(rank), LOCAL_RANK=str(rank))
        procs.append(
            ctx.Process(target=_script_rank, args=(str(script), argv, rank_env, output, rank))
        )
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=DEADLINE_S)
        if p.is_alive():
            for q in procs:
                q.kill()
            p.join()
    outs = [(output / f"{r}.out").read_text(errors="replace") for r in range(nproc)]
    errs = [(output / f"{r}.err").read_text(errors="replace") for r in range(nproc)]
    failed = {r: p.exitcode for r, p in enumerate(procs) if p.exitcode != 0}
    assert not failed, f"{script} {argv}: exit codes {failed}\n" + "\n".join(
        f"--- rank {r} stdout\n{outs[r][-3000:]}\n--- rank {r} stderr\n{errs[r][-5000:]}"
        for r in failed
    )
    return "".join(outs)
