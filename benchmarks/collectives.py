"""Collective bandwidth and latency: the neuron backend on neuron tensors against Gloo on CPU.

Two ranks (spawned processes, one neuron device each) join one process group
``init_process_group("cpu:gloo,neuron:neuron")``: CPU tensors go to Gloo, neuron tensors to
our backend, so both are measured in the same run on the same processes. For all_reduce,
all_gather_into_tensor and reduce_scatter_tensor, from 1 KiB to 256 MiB per rank (x4
steps), each size alternates Gloo and neuron blocks and reports the median time per call
(a barrier of the same backend starts each block).

    bus bandwidth = size / time x factor, factor = 2(P-1)/P for all_reduce and (P-1)/P for
    all_gather and reduce_scatter (the NCCL-tests convention; P = ranks)

Targets (issue 6): at least 3x Gloo's bus bandwidth from 1 MiB up; latency no worse than
Gloo's below 1 MiB (ratio = Gloo time / neuron time >= 1).

    python benchmarks/collectives.py             # 1 KiB .. 256 MiB (a few minutes)
    python benchmarks/collectives.py --quick     # 1 KiB .. 4 MiB
    python benchmarks/collectives.py --markdown  # also print the table as Markdown
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time

import torch
import torch.multiprocessing as mp
from _harness import Table, fmt, print_table

OPS = ("all_reduce", "all_gather", "reduce_scatter")
WORLD = 2
BANDWIDTH_TARGET = 3.0
MiB = 1 << 20


def bus_factor(op: str, size: int) -> float:
    return 2 * (size - 1) / size if op == "all_reduce" else (size - 1) / size


def call(op: str, buffers: tuple[torch.Tensor, ...]) -> None:
    import torch.distributed as dist

    if op == "all_reduce":
        dist.all_reduce(buffers[0])
    elif op == "all_gather":
        dist.all_gather_into_tensor(buffers[1], buffers[0])
    else:
        dist.reduce_scatter_tensor(buffers[1], buffers[0])


def make_buffers(op: str, nbytes: int, device: str) -> tuple[torch.Tensor, ...]:
    n = max(1, nbytes // 4)
    if op == "all_reduce":
        return (torch.ones(n, device=device),)
    if op == "all_gather":
        return torch.ones(n, device=device), torch.empty(n * WORLD, device=device)
    return torch.ones(n * WORLD, device=device), torch.empty(n, device=device)


def time_block(op: str, buffers: tuple[torch.Tensor, ...], iterations: int) -> float:
    import torch.distributed as dist

    # a barrier on the same backend lines the ranks up before the clock starts
    dist.all_reduce(torch.zeros(1, device=buffers[0].device))
    start = time.perf_counter()
    for _ in range(iterations):
        call(op, buffers)
    if not buffers[0].is_cpu:
        torch.neuron.synchronize()
    return (time.perf_counter() - start) / iterations


def rank_main(rank: int, port: int, sizes: list[int], rounds: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    import torch.distributed as dist

    dist.init_process_group("cpu:gloo,neuron:neuron", rank=rank, world_size=WORLD)
    rows = []
    for op in OPS:
        for nbytes in sizes:
            buffers = {
                "gloo": make_buffers(op, nbytes, "cpu"),
                "neuron": make_buffers(op, nbytes, "neuron"),
            }
            for b in buffers.values():
                call(op, b)  # warm up both paths
            # about 0.2 s of Gloo per block, agreed by all ranks (rank 0's estimate)
            probe = torch.tensor([time_block(op, buffers["gloo"], 1)])
            dist.broadcast(probe, 0)
            iterations = max(1, min(1000, int(0.2 / max(probe.item(), 1e-6))))
            samples = {"gloo": [], "neuron": []}
            for r in range(rounds):
                order = ("gloo", "neuron") if r % 2 == 0 else ("neuron", "gloo")
                for name in order:
                    samples[name].append(time_block(op, buffers[name], iterations))
            rows.append(
                (
                    op,
                    nbytes,
                    statistics.median(samples["gloo"]),
                    statistics.median(samples["neuron"]),
                )
            )
            if rank == 0:
                print(f"{op} {nbytes // 1024} KiB done", flush=True)
            del buffers
    dist.destroy_process_group()
    if rank == 0:
        results.put(rows)


def label(nbytes: int) -> str:
    return f"{nbytes // MiB} MiB" if nbytes >= MiB else f"{nbytes // 1024} KiB"


def table(rows: list[tuple[str, int, float, float]]) -> tuple[Table, int, int]:
    header = [
        "op",
        "size",
        "gloo µs",
        "neuron µs",
        "gloo busbw GB/s",
        "neuron busbw GB/s",
        "ratio",
        "target",
        "pass/miss",
    ]
    body, passed, total = [], 0, 0
    for op, nbytes, gloo, neuron in rows:
        factor = bus_factor(op, WORLD)
        gloo_bw, neuron_bw = nbytes * factor / gloo / 1e9, nbytes * factor / neuron / 1e9
        ratio = gloo / neuron
        target = BANDWIDTH_TARGET if nbytes >= MiB else 1.0
        ok = ratio >= target
        passed, total = passed + ok, total + 1
        body.append(
            [
                op,
                label(nbytes),
                fmt(gloo * 1e6),
                fmt(neuron * 1e6),
                fmt(gloo_bw),
                fmt(neuron_bw),
                f"{ratio:.2f}",
                f">= {target:g}",
                "pass" if ok else "MISS",
            ]
        )
    return Table(header, body), passed, total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 KiB .. 4 MiB, fewer rounds")
    parser.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    args = parser.parse_args(argv)
    top = 4 * MiB if args.quick else 256 * MiB
    sizes, n = [], 1024
    while n <= top:
        sizes.append(n)
        n *= 4
    rounds = 3 if args.quick else 5
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print(
        f"torch {torch.__version__}, {os.cpu_count()} cores, {WORLD} ranks, one intra-op "
        f"thread each, load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    start = time.perf_counter()
    procs = [
        ctx.Process(target=rank_main, args=(r, port, sizes, rounds, results)) for r in range(WORLD)
    ]
    for p in procs:
        p.start()
    rows = results.get(timeout=3600)
    for p in procs:
        p.join()
    t, passed, total = table(rows)
    print_table(t, args.markdown)
    print()
    print(
        f"{passed}/{total} rows within target; measured in {time.perf_counter() - start:.0f} s; "
        f"load average {os.getloadavg()[0]:.2f} at end"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
