"""The program each rank of tests/test_multihost.py's two-host torchrun job runs.

Two network namespaces with host names of their own (node0, node1) stand for two hosts;
torchrun starts two ranks on each. A rank records which transport each group got, checks
collectives across the hosts against closed forms, trains the tiny MLP of
tests/test_distributed.py with FSDP2 (flat over the four ranks, and HSDP: replicated across
hosts, sharded within one) and reports the trained parameters, then runs all_reduce in a loop
on a group with a short timeout until the test takes the link between the hosts down. What it
saw goes to $MULTIHOST_OUT/rank<N>.json; the test makes the comparisons.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

OUT = Path(os.environ["MULTIHOST_OUT"])
LINK_TIMEOUT_S = float(os.environ["MULTIHOST_LINK_TIMEOUT_S"])
sys.path.insert(0, str(Path(__file__).parent.parent))  # tests/
from test_distributed import _batches, _mlp  # noqa: E402  (the model and data of the suite)


def _write(rank: int, report: dict[str, Any]) -> None:
    path = OUT / f"rank{rank}.json"
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(report))
    partial.rename(path)  # the test never reads half a report


def _collectives(rank: int, size: int, dev: torch.device) -> None:
    """Closed forms over the world group, whose ranks span both hosts."""
    total = size * (size + 1) / 2
    t = torch.full((1000,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    assert torch.equal(t.cpu(), torch.full((1000,), total))
    t = torch.full((7,), float(rank + 1), device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    assert torch.equal(t.cpu(), torch.full((7,), total / size))
    out = torch.empty(3 * size, device=dev)
    dist.all_gather_into_tensor(out, torch.full((3,), float(rank), device=dev))
    assert out.cpu().tolist() == [float(r) for r in range(size) for _ in range(3)]
    block = torch.empty(4, device=dev)
    dist.reduce_scatter_tensor(block, torch.arange(4.0 * size, device=dev) * (rank + 1))
    assert block.cpu().tolist() == (torch.arange(4.0 * rank, 4.0 * rank + 4) * total).tolist()
    b = torch.full((5,), float(rank), device=dev)
    dist.broadcast(b, src=size - 1)
    assert b.cpu().tolist() == [float(size - 1)] * 5
    # uneven all_to_all_single: rank s sends s + d + 1 rows (value 10 s + d) to rank d
    send = [rank + d + 1 for d in range(size)]
    recv = [s + rank + 1 for s in range(size)]
    rows = torch.cat([torch.full((n, 2), 10.0 * rank + d) for d, n in enumerate(send)])
    got = torch.empty(sum(recv), 2, device=dev)
    dist.all_to_all_single(got, rows.to(dev), output_split_sizes=recv, input_split_sizes=send)
    assert torch.equal(
        got.cpu(), torch.cat([torch.full((n, 2), 10.0 * s + rank) for s, n in enumerate(recv)])
    )
    # point to point in a ring: 1 -> 2 and 3 -> 0 cross the link
    ring = torch.full((3,), float(rank), device=dev)
    incoming = torch.empty(3, device=dev)
    ops = [
        dist.P2POp(dist.isend, ring, (rank + 1) % size),
        dist.P2POp(dist.irecv, incoming, (rank - 1) % size),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    assert incoming.cpu().tolist() == [float((rank - 1) % size)] * 3


def _train(mesh: Any, rank: int, size: int, dev: torch.device) -> list[list[float]]:
    """Two SGD steps of FSDP2 over `mesh`; each rank takes its share of every batch."""
    from torch.distributed.fsdp import fully_shard

    model = _mlp().to(dev)
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x in _batches():
        opt.zero_grad()
        model(x.chunk(size)[rank].to(dev)).square().mean().backward()
        opt.step()
    return [p.full_tensor().cpu().flatten().tolist() for p in model.parameters()]


def _link_down_loop(rank: int, size: int, dev: torch.device, report: dict[str, Any]) -> None:
    """all_reduce until the test takes the link down; records the error and when it came."""
    link = dist.new_group(list(range(size)), timeout=datetime.timedelta(seconds=LINK_TIMEOUT_S))
    x = torch.ones(1 << 14, device=dev)
    dist.all_reduce(x, group=link)  # connected before the test is told we are ready
    (OUT / f"ready{rank}").touch()
    rounds, give_up = 0, time.monotonic() + LINK_TIMEOUT_S + 120
    while time.monotonic() < give_up:
        x.fill_(1.0)
        try:
            dist.all_reduce(x, group=link)
        except RuntimeError as error:
            report.update(link_error=str(error), link_error_at=time.time())
            break
        assert x[0].item() == size, x[0].item()
        rounds += 1
    report["rounds_before_link_down"] = rounds


def main() -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from torchneuron.distributed.process_group import transport

    rank = int(os.environ["RANK"])
    report: dict[str, Any] = {"rank": rank, "host": socket.gethostname()}
    try:
        dist.init_process_group("neuron", timeout=datetime.timedelta(seconds=60))
        size = dist.get_world_size()
        dev = torch.device("neuron", torch.neuron.current_device())
        report["local_rank"] = int(os.environ["LOCAL_RANK"])
        report["device"] = dev.index
        flat = init_device_mesh("neuron", (size,))
        hosts = init_device_mesh("neuron", (2, size // 2), mesh_dim_names=("host", "local"))
        report["transport"] = {
            "world": transport(),
            "local": transport(hosts.get_group("local")),  # ranks {0, 1} or {2, 3}
            "host": transport(hosts.get_group("host")),  # ranks {0, 2} or {1, 3}
        }
        _collectives(rank, size, dev)
        local = torch.full((2,), float(rank), device=dev)
        dist.all_reduce(local, group=hosts.get_group("local"))
        report["local_sum"] = local[0].item()
        report["fsdp"] = _train(flat, rank, size, dev)
        report["hsdp"] = _train(hosts, rank, size, dev)
        _link_down_loop(rank, size, dev, report)
    except BaseException:  # noqa: BLE001 - reported to the test, which fails
        report["error"] = traceback.format_exc()
    _write(rank, report)
    # No orderly teardown: with the link down it would wait for the other host.
    os._exit(1 if "error" in report else 0)


if __name__ == "__main__":
    main()
