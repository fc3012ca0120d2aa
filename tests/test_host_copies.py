"""Copies between neuron and host memory, and the caller's OpenMP team.

From 1 MiB a copy between tensors of one shape runs as two halves over the task board (the
waiting caller and the idle worker; csrc/aten/ops/device_tensor_ops.cpp), and PyTorch's CPU
kernels that a device op runs on the calling thread get one OpenMP thread where the board
covers the host's CPUs (InlineKernelThreads, host_kernel_executor.h): a team opened there
kept a thread spinning for milliseconds on the core the worker needed next. References: the
CPU's copy (bit for bit), the copy's own errors, and the threads of the process.
"""

from __future__ import annotations

import pytest
import torch
from conftest import run_python

import torchneuron

DEV = "neuron"
C = torchneuron._C
BLOCKING = C._launch_blocking()


def _cases() -> list[tuple[str, torch.Tensor]]:
    torch.manual_seed(0)
    return [
        ("contiguous 4 MiB", torch.randn(1024, 1024)),
        ("leading 1 (split on the second dim)", torch.randn(1, 3, 400_000)),
        ("odd rows", torch.randn(1023, 513)),
        ("transposed", torch.randn(800, 700).t()),
        ("strided columns", torch.randn(600, 1400)[:, ::2]),
        ("bf16", torch.randn(700, 1024).to(torch.bfloat16)),
    ]


@pytest.mark.parametrize("index", range(len(_cases())))
def test_large_copies_both_ways_equal_the_cpu_copy(index: int) -> None:
    _, host = _cases()[index]
    device = host.to(DEV)
    torch.neuron.synchronize()
    helped = C._helped_tasks()
    assert torch.equal(device.cpu(), host)
    back = torch.empty_like(host)
    back.copy_(device)
    assert torch.equal(back, host)
    into = torch.zeros(host.shape, dtype=host.dtype, device=DEV)
    into.copy_(host)
    assert torch.equal(into.cpu(), host)
    if BLOCKING:
        assert C._helped_tasks() == helped  # no worker, nothing shared


def test_a_copy_converting_dtypes_is_the_cpus() -> None:
    host = torch.randn(1024, 768) * 1000
    device = host.to(DEV)
    assert torch.equal(device.to("cpu", torch.float16), host.to(torch.float16))
    assert torch.equal(device.to(torch.int32).cpu(), host.to(torch.int32))
    out = torch.empty(1024, 768, dtype=torch.float64)
    out.copy_(device)
    assert torch.equal(out, host.double())


def test_overlapping_views_of_one_storage_are_refused_as_on_the_cpu() -> None:
    host = torch.arange(2_000_000, dtype=torch.float32)
    device = host.to(DEV)
    with pytest.raises(RuntimeError, match="single memory location"):
        host[1:].copy_(host[:-1])
    with pytest.raises(RuntimeError, match="single memory location"):
        device[1:].copy_(device[:-1])
        torch.neuron.synchronize()
    assert torch.equal(device.cpu(), host)  # neither copy wrote anything


def test_a_destination_whose_elements_share_memory_is_refused_as_on_the_cpu() -> None:
    # Each half of an expanded destination is free of overlap alone; the whole is not.
    source = torch.randn(2, 1_000_000)
    device = source.to(DEV)
    with pytest.raises(RuntimeError, match="single memory location"):
        torch.zeros(1, 1_000_000).expand(2, 1_000_000).copy_(source)
    target = torch.zeros(1, 1_000_000)
    with pytest.raises(RuntimeError, match="single memory location"):
        target.expand(2, 1_000_000).copy_(device)
    assert torch.equal(target, torch.zeros(1, 1_000_000))
    on_device = torch.zeros(1, 1_000_000, device=DEV)
    with pytest.raises(RuntimeError, match="single memory location"):
        on_device.expand(2, 1_000_000).copy_(source)
        torch.neuron.synchronize()


def test_copies_out_keep_program_order_over_many_iterations() -> None:
    # Each iteration launches work that writes the tensor, then reads it to the host: a copy
    # that ran before the writes, or halves of two iterations mixed, would differ from the
    # same steps on the CPU.
    x = torch.zeros(1024, 1024, device=DEV)
    expected = torch.zeros(1024, 1024)
    for _ in range(30):
        x.add_(1.0)
        x[::2].mul_(2.0)
        expected.add_(1.0)
        expected[::2].mul_(2.0)
        assert torch.equal(x.cpu(), expected)


def test_a_caller_with_two_threads_opens_no_openmp_team_for_device_work() -> None:
    # In a process limited to two CPUs (the board covers them), with torch's two threads: the
    # stream worker is the only thread device work adds, whatever the caller copies or runs
    # inline. A parallel region opened on the caller would add its team's second thread.
    code = """
        import os
        cpus = sorted(os.sched_getaffinity(0))[:2]
        os.sched_setaffinity(0, cpus)
        import torch, torchneuron
        torch.set_num_threads(2)
        threads = lambda: len(os.listdir("/proc/self/task"))
        x = torch.randn(2048, 2048, device="neuron")
        y = x + 1  # starts the stream's worker
        torch.neuron.synchronize()
        before = threads()
        for _ in range(3):
            host = (y * 2).cpu()                      # 16 MiB out
            z = torch.empty(2048, 2048, device="neuron")
            z.copy_(host)                             # and in
            nz = torch.nonzero(z > 0)                 # an op that runs inline on the caller
            s = float(z.sum())
        expected = (x * 2 + 2).cpu()
        torch.neuron.synchronize()
        after = threads()  # before the CPU work below, which opens this thread's team
        print(before, after, torch.equal(host, expected), nz.shape[0] > 0 and s != 0.0)
    """
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    before, after, *checks = result.stdout.split()
    assert checks == ["True", "True"]
    assert int(after) == int(before), "a device op opened an OpenMP team on the caller"
