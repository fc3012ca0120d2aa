"""torch.distributed with the "neuron" process-group backend, across spawned processes.

Each test starts its ranks with the spawn method (the runtime refuses forked children), one
neuron device per rank (LOCAL_RANK), and checks results against closed forms or a single-
process reference: float32 within atol 1e-5 / rtol 1e-4, bfloat16 values chosen to be exact.
The launcher kills its ranks after a deadline, so a hang fails the test instead of CI.
"""

from __future__ import annotations

import os
import queue
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from support.ranks import free_port, rank_context, rank_entry, run_ranks

TOL = {"atol": 1e-5, "rtol": 1e-4}
DEADLINE_S = 180


# --- collectives -----------------------------------------------------------------------


def _collectives(rank: int, size: int) -> str:
    import torch.distributed as dist

    dev = torch.device("neuron", rank)
    assert torch.neuron.current_device() == rank  # LOCAL_RANK chose the device
    total = size * (size + 1) / 2

    t = torch.full((1000,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    assert t.device == dev and torch.equal(t.cpu(), torch.full((1000,), total))
    for op, expected in (
        (dist.ReduceOp.MAX, size),
        (dist.ReduceOp.MIN, 1),
        (dist.ReduceOp.PRODUCT, float(torch.arange(1, size + 1).prod())),
        (dist.ReduceOp.AVG, total / size),
    ):
        t = torch.full((7,), float(rank + 1), device=dev)
        dist.all_reduce(t, op=op)
        torch.testing.assert_close(t.cpu(), torch.full((7,), float(expected)), **TOL)
    premul = torch.full((3,), float(rank + 1), device=dev)
    dist.all_reduce(premul, op=dist._make_nccl_premul_sum(0.5))
    torch.testing.assert_close(premul.cpu(), torch.full((3,), total * 0.5), **TOL)
    for dtype in (torch.bfloat16, torch.float16, torch.int32, torch.int64):
        t = torch.full((5,), rank + 1, device=dev, dtype=dtype)
        dist.all_reduce(t)
        assert t.dtype == dtype and t.cpu().tolist() == [total] * 5

    out = torch.empty(3 * size, device=dev)
    dist.all_gather_into_tensor(out, torch.full((3,), float(rank), device=dev))
    assert out.cpu().tolist() == [float(r) for r in range(size) for _ in range(3)]
    parts = [torch.empty(2, device=dev, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(parts, torch.tensor([rank, -rank], device=dev))
    assert [p.cpu().tolist() for p in parts] == [[r, -r] for r in range(size)]

    block = torch.empty(4, device=dev)
    src = torch.arange(4.0 * size, device=dev) * (rank + 1)
    dist.reduce_scatter_tensor(block, src, op=dist.ReduceOp.AVG)
    expected = torch.arange(4.0 * rank, 4.0 * rank + 4) * total / size
    torch.testing.assert_close(block.cpu(), expected, **TOL)

    b = torch.full((5,), float(rank), device=dev)
    dist.broadcast(b, src=size - 1)
    assert b.cpu().tolist() == [float(size - 1)] * 5
    s = torch.empty(2, device=dev)
    chunks = [torch.full((2,), 10.0 + r, device=dev) for r in range(size)] if rank == 0 else None
    dist.scatter(s, chunks, src=0)
    assert s.cpu().tolist() == [10.0 + rank] * 2
    r = torch.full((2,), float(rank + 1), device=dev)
    dist.reduce(r, dst=0)
    assert r.cpu().tolist() == ([total] * 2 if rank == 0 else [float(rank + 1)] * 2)
    gathered = [torch.empty(1, device=dev) for _ in range(size)] if rank == 0 else None
    dist.gather(torch.tensor([rank * 2.0], device=dev), gathered, dst=0)
    if rank == 0:
        assert [g.item() for g in gathered] == [2.0 * q for q in range(size)]

    # uneven all_to_all_single: rank s sends s + d + 1 rows (value 10 s + d) to rank d
    send = [rank + d + 1 for d in range(size)]
    recv = [s + rank + 1 for s in range(size)]
    rows = torch.cat([torch.full((n, 2), 10.0 * rank + d) for d, n in enumerate(send)])
    got = torch.empty(sum(recv), 2, device=dev)
    dist.all_to_all_single(got, rows.to(dev), output_split_sizes=recv, input_split_sizes=send)
    expected = torch.cat([torch.full((n, 2), 10.0 * s + rank) for s, n in enumerate(recv)])
    assert torch.equal(got.cpu(), expected)
    outs = [torch.empty(2, device=dev) for _ in range(size)]
    dist.all_to_all(outs, [torch.full((2,), 100.0 * rank + d, device=dev) for d in range(size)])
    assert [o.cpu().tolist() for o in outs] == [[100.0 * s + rank] * 2 for s in range(size)]

    work = dist.all_reduce(torch.ones(4, device=dev), async_op=True)
    work.wait()
    assert work.get_future().value()[0].cpu().tolist() == [float(size)] * 4
    # point to point: a ring
    ring = torch.full((3,), float(rank), device=dev)
    incoming = torch.empty(3, device=dev)
    ops = [
        dist.P2POp(dist.isend, ring, (rank + 1) % size),
        dist.P2POp(dist.irecv, incoming, (rank - 1) % size),
    ]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert incoming.cpu().tolist() == [float((rank - 1) % size)] * 3

    cpu = torch.tensor([rank])
    dist.all_reduce(cpu)  # CPU tensors of the group go through the same backend
    assert cpu.item() == size * (size - 1) // 2
    dist.barrier()
    return "ok"


@pytest.mark.parametrize(("size", "transport"), [(2, "shm"), (4, "shm"), (2, "gloo")])
def test_collectives_match_closed_forms(size, transport, monkeypatch):
    # gloo: the cross-host path, forced on one host by the documented variable
    monkeypatch.setenv("TORCHNEURON_DIST_TRANSPORT", transport)
    assert run_ranks(_collectives, size) == dict.fromkeys(range(size), "ok")
    # Segments are unlinked once every rank has attached: none may outlive the rank that made
    # it (its pid is in the name; other test processes running beside this one may hold theirs).
    prefix = f"torchneuron-{os.geteuid()}-"
    leftovers = [
        p.name
        for p in Path("/dev/shm").glob(f"{prefix}*")
        if not Path(f"/proc/{p.name[len(prefix) :].split('-')[0]}").exists()
    ]
    assert not leftovers


# --- parallel training ---------------------------------------------------------------------


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))


def _batches() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(8, 16, generator=g) for _ in range(2)]


def _single_device_reference() -> torch.nn.Module:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x in _batches():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    return model


def _train(model: torch.nn.Module, rank: int, size: int, dev: torch.device) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x in _batches():  # each rank takes its share of the batch; gradients are averaged
        opt.zero_grad()
        model(x.chunk(size)[rank].to(dev)).square().mean().backward()
        opt.step()


def _parallel_training(rank: int, size: int) -> str:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    from torch.nn.parallel import DistributedDataParallel

    dev = torch.device("neuron", rank)
    reference = list(_single_device_reference().parameters())

    ddp = DistributedDataParallel(_mlp().to(dev))
    _train(ddp, rank, size, dev)
    for p, q in zip(reference, ddp.module.parameters(), strict=True):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), **TOL)

    mesh = init_device_mesh("neuron", (size,))
    fsdp = _mlp().to(dev)
    for layer in (fsdp[0], fsdp[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(fsdp, mesh=mesh)
    _train(fsdp, rank, size, dev)
    for p, q in zip(reference, fsdp.parameters(), strict=True):
        assert q.device.type == "neuron"
        torch.testing.assert_close(q.full_tensor().cpu(), p.detach(), **TOL)

    # FSDP2 on a Llama-style model: every decoder layer and the root sharded
    from conftest import tiny_llama

    ids = torch.randint(3, 64, (2 * size, 12), generator=torch.Generator().manual_seed(2))
    single = tiny_llama()
    sharded = tiny_llama().to(dev)
    for layer in sharded.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(sharded, mesh=mesh)
    for model, batch in ((single, ids), (sharded, ids.chunk(size)[rank].to(dev))):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            opt.zero_grad()
            model(input_ids=batch, labels=batch).loss.backward()
            opt.step()
    for (name, p), q in zip(single.named_parameters(), sharded.parameters(), strict=True):
        torch.testing.assert_close(q.full_tensor().cpu(), p.detach(), **TOL, msg=name)

    tp = parallelize_module(_mlp().to(dev), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = _batches()[0]
    out = tp(x.to(dev))
    out.square().mean().backward()
    expected_model = _mlp()
    expected = expected_model(x)
    expected.square().mean().backward()
    torch.testing.assert_close(out.cpu(), expected.detach(), **TOL)
    torch.testing.assert_close(
        tp[0].weight.grad.full_tensor().cpu(), expected_model[0].weight.grad, **TOL
    )
    return "ok"


@pytest.mark.parametrize("size", [2, 4])
def test_ddp_fsdp2_and_tensor_parallel_equal_one_device(size):
    assert run_ranks(_parallel_training, size) == dict.fromkeys(range(size), "ok")


# --- faults --------------------------------------------------------------------------------


def _killed_peer(rank: int, size: int) -> str:
    import signal
    import time

    import torch.distributed as dist

    dist.all_reduce(torch.ones(4, device="neuron"))
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # dies without joining the next collective
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1 << 20, device="neuron"))
    except RuntimeError as error:
        waited = time.monotonic() - start
        message = str(error)
        assert "all_reduce" in message and "rank 1" in message and "exited" in message, message
        assert waited < 2, f"the dead rank was noticed after {waited:.2f} s"
        os._exit(0)  # the group is broken; skip the orderly teardown
    raise AssertionError("all_reduce with a dead peer returned")


def _stalled_peer(rank: int, size: int) -> str:
    import datetime
    import time

    import torch.distributed as dist

    if rank == 1:
        time.sleep(3)  # alive, but late for rank 0's barrier
        try:
            dist.barrier()  # rank 0 gave up and exited: noticed by liveness, no hang
        except RuntimeError as error:
            assert "rank 0" in str(error) and "exited" in str(error), str(error)
            os._exit(0)
        raise AssertionError("a barrier with an exited peer returned")
    start = time.monotonic()
    try:
        dist.barrier(timeout=datetime.timedelta(milliseconds=500))
    except RuntimeError as error:
        waited = time.monotonic() - start
        message = str(error)
        assert "timed out after 500 ms" in message, message
        assert "rank 1" in message and "stalled" in message, message
        assert waited < 2, f"the call timeout fired after {waited:.2f} s"
        os._exit(0)
    raise AssertionError("a barrier with a stalled peer returned")


def _run_fault(fn: Callable[[int, int], object]) -> list[int | None]:
    """Runs a fault scenario whose ranks end with os._exit(0) once their checks pass. The group
    timeout is a long 60 s: faults must be noticed by liveness or the call's own timeout."""
    ctx = rank_context()
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=rank_entry, args=(fn, r, 2, port, results), kwargs={"group_timeout_s": 60}
        )
        for r in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=DEADLINE_S)
        if p.is_alive():
            p.kill()
            pytest.fail("a rank hung")
    reports = []
    while True:
        try:
            reports.append(results.get(timeout=1))
        except queue.Empty:
            break
    assert not [r for r in reports if r[1] == "error"], reports
    return [p.exitcode for p in procs]


def test_killed_rank_is_reported_within_seconds():
    """A rank SIGKILLed between collectives is named as exited by its peer in under 2 s,
    with a 60 s group timeout (regression: it was reported only at the group timeout)."""
    assert _run_fault(_killed_peer) == [0, -9]


def test_per_call_timeout_is_honoured():
    """dist.barrier(timeout=500 ms) raises after 500 ms naming the stalled rank, with a 60 s
    group timeout (regression: the shared-memory path used the group timeout)."""
    assert _run_fault(_stalled_peer) == [0, 0]


def _mismatch(rank: int, size: int) -> str:
    import torch.distributed as dist

    t = torch.ones(4 + rank, device="neuron")
    try:
        dist.all_reduce(t)
    except RuntimeError as error:
        assert "do not match" in str(error), str(error)
    else:
        raise AssertionError("mismatched all_reduce did not raise")
    t = torch.ones(4, device="neuron")
    dist.all_reduce(t)  # the group is still usable
    assert t.cpu().tolist() == [float(size)] * 4
    return "ok"


def test_mismatched_shapes_raise_on_every_rank():
    assert run_ranks(_mismatch, 2) == {0: "ok", 1: "ok"}


def _dtype_mismatch(rank: int, size: int) -> str:
    import torch.distributed as dist

    # float32 and int32 have the same size: only the dtype tells the calls apart.
    for collective in ("broadcast", "all_gather"):
        t = torch.ones(4, device="neuron", dtype=torch.float32 if rank == 0 else torch.int32)
        try:
            if collective == "broadcast":
                dist.broadcast(t, src=0)
            else:
                dist.all_gather_into_tensor(torch.empty(8, device="neuron", dtype=t.dtype), t)
        except RuntimeError as error:
            assert "do not match" in str(error) and "Float" in str(error), str(error)
        else:
            raise AssertionError(f"{collective} of float32 against int32 did not raise")
    t = torch.full((4,), float(rank), device="neuron")
    dist.broadcast(t, src=1)  # the group is still usable
    assert t.cpu().tolist() == [1.0] * 4
    return "ok"


def test_mismatched_dtypes_of_equal_size_raise_on_every_rank():
    """Regression (fuzzing): broadcast and all_gather moved float32 bytes into int32 tensors."""
    assert run_ranks(_dtype_mismatch, 2) == {0: "ok", 1: "ok"}


def _debug_detail(rank: int, size: int) -> str:
    import torch.distributed as dist

    assert dist.get_debug_level() == dist.DebugLevel.DETAIL
    # DETAIL wraps the backend in a checker that compares each call's fingerprint, sequence
    # number included, across ranks through a Gloo group before running it.
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("neuron"))
    before = backend._get_sequence_number_for_group()
    t = torch.ones(4, device="neuron")
    dist.all_reduce(t)
    assert t.cpu().tolist() == [float(size)] * 4
    assert backend._get_sequence_number_for_group() == before + 1
    t = torch.ones(4 if rank == 0 else 5, device="neuron")
    try:
        dist.all_reduce(t)
    except RuntimeError as error:
        assert "Detected mismatch between collectives" in str(error), str(error)
    else:
        raise AssertionError("mismatched shapes were not reported under DETAIL")
    return "ok"


def test_torch_distributed_debug_detail_checks_collectives(monkeypatch):
    """Regression (PyTorch's test_stage.py under DETAIL): the group could not be made, since
    the backend kept no sequence numbers."""
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
    assert run_ranks(_debug_detail, 2) == {0: "ok", 1: "ok"}


TORCHRUN_SCRIPT = """
import os, sys
import torch, torch.distributed as dist
sys.path.insert(0, {tests!r})
from conftest import tiny_llama
from torch.distributed.device_mesh import init_device_mesh
from transformers import AutoModelForCausalLM

# no init_process_group: the device mesh creates the group with the device's backend
mesh = init_device_mesh("neuron", (int(os.environ["WORLD_SIZE"]),))
rank = dist.get_rank()
assert torch.neuron.current_device() == int(os.environ["LOCAL_RANK"])
path = {path!r}
if rank == 0:
    tiny_llama(hidden_size=64, intermediate_size=128).save_pretrained(path)
dist.barrier()
ids = torch.randint(3, 64, (1, 8), generator=torch.Generator().manual_seed(0))
expected = AutoModelForCausalLM.from_pretrained(path).eval().generate(
    ids, max_new_tokens=8, do_sample=False)
tp = AutoModelForCausalLM.from_pretrained(path, tp_plan="auto", device_mesh=mesh).eval()
assert type(tp.model.layers[0].self_attn.q_proj.weight).__name__ == "DTensor"
got = tp.generate(ids.to(tp.device), max_new_tokens=8, do_sample=False)
assert got.device.type == "neuron"
assert got.cpu().tolist() == expected.tolist(), (got, expected)
print("rank", rank, "same tokens")
dist.destroy_process_group()
"""


def test_torchrun_transformers_tensor_parallel_generation(tmp_path):
    """torchrun, 2 processes: Transformers' tp_plan="auto" over a neuron device mesh
    generates the same greedy tokens as the unsharded model on the CPU."""
    import subprocess
    import sys

    script = tmp_path / "tp_generate.py"
    script.write_text(
        TORCHRUN_SCRIPT.format(tests=str(Path(__file__).parent), path=str(tmp_path / "llama"))
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.count("same tokens") == 2, done.stdout
