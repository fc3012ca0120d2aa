"""Collective bandwidth and latency: the neuron backend on neuron tensors against Gloo on CPU
and against the host's own memcpy bandwidth.

Two ranks (``--ranks``; spawned processes, one neuron device and one thread each) join one
process group ``init_process_group("cpu:gloo,neuron:neuron")``: CPU tensors go to Gloo,
neuron tensors to our backend, so both are measured in the same run on the same processes.
For all_reduce, all_gather_into_tensor and reduce_scatter_tensor, from 1 KiB to 256 MiB
(``--to-mib``) per rank (x4 steps;
"size" is the all_reduce buffer, the all_gather input and the reduce_scatter output), each
size rotates blocks of: Gloo, neuron, memcpy on both ranks at once, memcpy on rank 0 alone
(a barrier of our backend starts each block), and reports medians.

    bus bandwidth = S / time x factor, the NCCL-tests convention (doc/PERFORMANCE.md):
    all_reduce S = the buffer, factor 2(P-1)/P; all_gather S = the gathered output and
    reduce_scatter S = the input (P x size), factor (P-1)/P; P = ranks

memcpy bandwidth = bytes copied / time, for `size` bytes from one neuron buffer to another
with libc memcpy (what the collectives copy with), one thread per process. The reference
is the concurrent figure (both ranks copying at once, per rank): a collective keeps both
ranks copying at the same time, through the same caches and memory controllers, so that is
the bandwidth each rank can have; one process alone may get more of the shared memory
system (printed for comparison). "busbw / memcpy" is paired: the ratio of each round's
neuron block to the memcpy block beside it, then the median over rounds, so a change in
the host's speed between rounds (this project's shared hosts drift by 2x within seconds)
moves both sides of a ratio alike; the bandwidth columns are each side's own median.

Targets: issue 6, at least 3x Gloo's bus bandwidth from 1 MiB up and latency no worse than
Gloo's below 1 MiB; issue 33, bus bandwidth at least 0.5x the concurrent memcpy bandwidth
from 16 MiB to 1 GiB at 2 and 4 ranks, or the bound that prevents it.

    python benchmarks/collectives.py                  # 1 KiB .. 256 MiB (several minutes)
    python benchmarks/collectives.py --quick          # 1 KiB .. 4 MiB
    python benchmarks/collectives.py --from-mib 16 --no-gloo   # the memcpy target only
    python benchmarks/collectives.py --from-mib 16 --to-mib 1024 --no-gloo --ranks 4
    python benchmarks/collectives.py --markdown       # also print the table as Markdown
"""

from __future__ import annotations

import argparse
import ctypes
import os
import socket
import statistics
import sys
import time

import torch
import torch.multiprocessing as mp
from _harness import Table, fmt, print_table

OPS = ("all_reduce", "all_gather", "reduce_scatter")
GLOO_TARGET = 3.0
MEMCPY_TARGET = 0.5
MEMCPY_FROM = 16 << 20
MiB = 1 << 20
BLOCK_SECONDS = 0.15


def bus_bytes(op: str, nbytes: int, ranks: int) -> float:
    """Bytes per call that count towards bus bandwidth (NCCL-tests' S x factor)."""
    if op == "all_reduce":
        return nbytes * 2 * (ranks - 1) / ranks
    return nbytes * ranks * (ranks - 1) / ranks


def call(op: str, buffers: tuple[torch.Tensor, ...]) -> None:
    import torch.distributed as dist

    if op == "all_reduce":
        dist.all_reduce(buffers[0])
    elif op == "all_gather":
        dist.all_gather_into_tensor(buffers[1], buffers[0])
    else:
        dist.reduce_scatter_tensor(buffers[1], buffers[0])


def make_buffers(
    op: str, nbytes: int, device: str, dtype: torch.dtype, ranks: int
) -> tuple[torch.Tensor, ...]:
    n = max(1, nbytes // torch.tensor([], dtype=dtype).element_size())
    if op == "all_reduce":
        return (torch.ones(n, device=device, dtype=dtype),)
    if op == "all_gather":
        return torch.ones(n, device=device, dtype=dtype), torch.empty(
            n * ranks, device=device, dtype=dtype
        )
    return torch.ones(n * ranks, device=device, dtype=dtype), torch.empty(
        n, device=device, dtype=dtype
    )


def line_up() -> None:
    """A barrier of our backend: the ranks start each block together."""
    import torch.distributed as dist

    dist.all_reduce(torch.zeros(1, device="neuron"))


class Collective:
    def __init__(self, op: str, buffers: tuple[torch.Tensor, ...]) -> None:
        self.op, self.buffers = op, buffers

    def __call__(self) -> None:
        call(self.op, self.buffers)


class Memcpy:
    """libc memcpy between two neuron buffers of `nbytes` (device memory is host memory)."""

    def __init__(self, nbytes: int) -> None:
        self.src = torch.ones(nbytes, dtype=torch.uint8, device="neuron")
        self.dst = torch.zeros(nbytes, dtype=torch.uint8, device="neuron")
        self.nbytes = nbytes

    def __call__(self) -> None:
        ctypes.memmove(self.dst.data_ptr(), self.src.data_ptr(), self.nbytes)


def time_block(name: str, fn, rank: int, iterations: int) -> float:
    """Seconds per call over one block, on this rank. "memcpy1" runs on rank 0 only."""
    line_up()
    start = time.perf_counter()
    if name != "memcpy1" or rank == 0:
        for _ in range(iterations):
            fn()
        if name == "neuron":
            torch.neuron.synchronize()
    return (time.perf_counter() - start) / iterations


def rank_main(
    rank: int,
    ranks: int,
    port: int,
    sizes: list[int],
    rounds: int,
    gloo: bool,
    dtype_name: str,
    results,
) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    import torch.distributed as dist

    dtype = getattr(torch, dtype_name)
    dist.init_process_group("cpu:gloo,neuron:neuron", rank=rank, world_size=ranks)
    rows = []
    for op in OPS:
        for nbytes in sizes:
            fns = {"neuron": Collective(op, make_buffers(op, nbytes, "neuron", dtype, ranks))}
            if gloo:
                fns["gloo"] = Collective(op, make_buffers(op, nbytes, "cpu", dtype, ranks))
            fns["memcpy"] = fns["memcpy1"] = Memcpy(nbytes)
            iterations = {}
            for name, fn in fns.items():
                fn()  # warm up (first touch of the buffers)
                # about BLOCK_SECONDS per block, agreed by all ranks (rank 0's estimate)
                probe = torch.tensor([time_block(name, fn, rank, 1)], device="neuron")
                dist.broadcast(probe, 0)
                per_call = max(probe.item(), 1e-6)
                iterations[name] = max(1, min(1000, int(BLOCK_SECONDS / per_call)))
            samples: dict[str, list[float]] = {name: [] for name in fns}
            names = list(fns)
            for r in range(rounds):
                order = names[r % len(names) :] + names[: r % len(names)]
                for name in order:
                    samples[name].append(time_block(name, fns[name], rank, iterations[name]))
            medians = {k: statistics.median(v) for k, v in samples.items()}
            # The target's ratio round by round (each neuron block beside its memcpy block,
            # under the same host conditions), then the median of those.
            paired = statistics.median(
                bus_bytes(op, nbytes, ranks) / n / (nbytes / m)
                for n, m in zip(samples["neuron"], samples["memcpy"], strict=True)
            )
            rows.append((op, nbytes, medians, paired))
            if rank == 0:
                print(f"{op} {label(nbytes)} done", flush=True)
            del fns
    dist.destroy_process_group()
    if rank == 0:
        results.put(rows)


def label(nbytes: int) -> str:
    return f"{nbytes // MiB} MiB" if nbytes >= MiB else f"{nbytes // 1024} KiB"


def table(
    rows: list[tuple[str, int, dict[str, float], float]], ranks: int
) -> tuple[Table, int, int]:
    gloo = "gloo" in rows[0][2]
    header = ["op", "size", "neuron µs", "neuron busbw GB/s"]
    if gloo:
        header += ["gloo µs", "gloo busbw GB/s", "vs gloo"]
    header += ["memcpy 1-proc GB/s", f"memcpy {ranks}-proc GB/s", "busbw / memcpy", "target"]
    header += ["pass/miss"]
    body, passed, total = [], 0, 0
    for op, nbytes, t, ratio in rows:
        busbw = bus_bytes(op, nbytes, ranks) / t["neuron"] / 1e9
        memcpy = nbytes / t["memcpy"] / 1e9
        memcpy1 = nbytes / t["memcpy1"] / 1e9
        row = [op, label(nbytes), fmt(t["neuron"] * 1e6), fmt(busbw)]
        targets, ok = [], True
        if gloo:
            vs_gloo = t["gloo"] / t["neuron"]
            row += [fmt(t["gloo"] * 1e6), fmt(bus_bytes(op, nbytes, ranks) / t["gloo"] / 1e9)]
            row.append(f"{vs_gloo:.2f}")
            goal = GLOO_TARGET if nbytes >= MiB else 1.0
            targets.append(f"gloo >= {goal:g}")
            ok = ok and vs_gloo >= goal
        if nbytes >= MEMCPY_FROM:
            targets.append(f"memcpy >= {MEMCPY_TARGET:g}")
            ok = ok and ratio >= MEMCPY_TARGET
        row += [fmt(memcpy1), fmt(memcpy), f"{ratio:.2f}", ", ".join(targets) or "-"]
        if targets:
            passed, total = passed + ok, total + 1
            row.append("pass" if ok else "MISS")
        else:
            row.append("-")
        body.append(row)
    return Table(header, body), passed, total


def host_line(ranks: int) -> str:
    import torchneuron

    isa = torchneuron._C._kernel_isa()
    return (
        f"torch {torch.__version__}, CPU {isa['model']}, ISA {isa['isa']}, {os.cpu_count()} "
        f"cores, {ranks} ranks with one thread each, load average {os.getloadavg()[0]:.2f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 KiB .. 4 MiB, fewer rounds")
    parser.add_argument("--from-mib", type=int, default=0, help="smallest size, MiB")
    parser.add_argument("--to-mib", type=int, default=256, help="largest size, MiB")
    parser.add_argument("--ranks", type=int, default=2, help="processes (one thread each)")
    parser.add_argument("--no-gloo", action="store_true", help="skip Gloo (memcpy target only)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    args = parser.parse_args(argv)
    if args.ranks < 2:
        parser.error("--ranks: at least 2")
    top = 4 * MiB if args.quick else args.to_mib * MiB
    sizes, n = [], max(1024, args.from_mib * MiB)
    while n <= top:
        sizes.append(n)
        n *= 4
    rounds = 3 if args.quick else 5
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print(host_line(args.ranks) + f", {args.dtype}", flush=True)
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    start = time.perf_counter()
    procs = [
        ctx.Process(
            target=rank_main,
            args=(r, args.ranks, port, sizes, rounds, not args.no_gloo, args.dtype, results),
        )
        for r in range(args.ranks)
    ]
    for p in procs:
        p.start()
    rows = results.get(timeout=3600)
    for p in procs:
        p.join()
    t, passed, total = table(rows, args.ranks)
    print_table(t, args.markdown)
    print()
    print(
        f"{passed}/{total} rows within target; measured in {time.perf_counter() - start:.0f} s; "
        f"load average {os.getloadavg()[0]:.2f} at end"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
