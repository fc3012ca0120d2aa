"""Kernels shared with waiting threads (csrc/runtime/task_board.h).

A thread blocked on device work runs tasks of the kernel the stream's worker runs, and an
idle worker runs tasks of a kernel the caller runs itself (a compiled graph). References:
the same computation with sharing switched off must be bit for bit equal (every task is
computed the same on any thread), and the CPU's result within the native kernels' usual
tolerances. In blocking mode (NEURON_LAUNCH_BLOCKING=1) no worker exists and nothing is
shared, which is asserted too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch
from conftest import run_python

import torchneuron

DEV = "neuron"
C = torchneuron._C
BLOCKING = C._launch_blocking()


@contextmanager
def waiters_help(enabled: bool) -> Iterator[None]:
    before = C._waiters_help()
    C._set_waiters_help(enabled)
    try:
        yield
    finally:
        C._set_waiters_help(before)


def _helped_during(fn: Callable[[], object]) -> tuple[object, int]:
    torch.neuron.synchronize()
    before = C._helped_tasks()
    result = fn()
    torch.neuron.synchronize()
    return result, C._helped_tasks() - before


def test_waiting_for_launched_products_lends_the_calling_thread() -> None:
    torch.manual_seed(0)
    a, b = torch.randn(512, 1024), torch.randn(1024, 1024)
    x, w = a.to(DEV), b.to(DEV)

    def products() -> list[torch.Tensor]:
        return [x @ w for _ in range(6)]  # ~6 GFLOP: the synchronize below finds them running

    with waiters_help(True):
        results, helped = _helped_during(products)
    if BLOCKING:
        assert helped == 0  # each product ran on this thread before the next was issued
    else:
        assert helped > 0
    expected = a @ b
    for r in results:
        torch.testing.assert_close(r.cpu(), expected, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    ("m", "n", "k"),
    [(1, 2048, 768), (3, 768, 2048), (8, 1000, 520), (64, 768, 768), (300, 520, 264)],
)
def test_results_do_not_depend_on_which_thread_ran_a_task(
    dtype: torch.dtype, m: int, n: int, k: int
) -> None:
    torch.manual_seed(m * n)
    a = torch.randn(m, k).to(dtype)
    w = torch.randn(n, k).to(dtype)
    x, wd = a.to(DEV), w.to(DEV)

    def linear() -> list[torch.Tensor]:  # several, so the wait finds one running
        return [torch.nn.functional.linear(x, wd) for _ in range(4)]

    with waiters_help(False):
        alone, helped_off = _helped_during(linear)
    with waiters_help(True):
        shared, _ = _helped_during(linear)
    assert helped_off == 0
    for r in alone + shared:
        assert torch.equal(r.cpu(), alone[0].cpu())
    tol = {"rtol": 1e-4, "atol": 1e-3} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 5e-2}
    expected = torch.nn.functional.linear(a.float(), w.float())
    torch.testing.assert_close(shared[0].cpu().float(), expected, **tol)


# Row and elementwise native kernels over 512 x 8000 (an LM head's logits: 125 tasks of
# 32K elements). Each takes its inputs (standard normal, fixed seed) and returns a tensor.
ROW_AND_ELEMENTWISE = {
    "softmax": lambda x, g: torch.softmax(x, -1),
    "log_softmax": lambda x, g: torch.log_softmax(x, -1),
    "softmax_backward": lambda x, g: torch.ops.aten._softmax_backward_data(
        g, torch.softmax(x, -1), -1, x.dtype
    ),
    "log_softmax_backward": lambda x, g: torch.ops.aten._log_softmax_backward_data(
        g, torch.log_softmax(x, -1), -1, x.dtype
    ),
    "silu": lambda x, g: torch.nn.functional.silu(x),
    "silu_backward": lambda x, g: torch.ops.aten.silu_backward(g, x),
    "silu_mul": lambda x, g: torch.ops.torchneuron.silu_mul(x, g),
}


@pytest.mark.parametrize(
    ("name", "dtype"),
    [(name, torch.float32) for name in ROW_AND_ELEMENTWISE]
    # bf16 log_softmax keeps PyTorch's CPU kernel (native_row_ops.cpp), which is not shared.
    + [(name, torch.bfloat16) for name in ROW_AND_ELEMENTWISE if "log_softmax" not in name],
)
def test_row_and_elementwise_kernels_are_shared_and_keep_their_bits(
    name: str, dtype: torch.dtype
) -> None:
    fn = ROW_AND_ELEMENTWISE[name]
    g = torch.Generator().manual_seed(7)
    x = torch.randn(512, 8000, generator=g).to(dtype)
    grad = torch.randn(512, 8000, generator=g).to(dtype)
    xd, gd = x.to(DEV), grad.to(DEV)

    def run() -> list[torch.Tensor]:  # several, so the wait finds one running
        return [fn(xd, gd) for _ in range(4)]

    with waiters_help(False):
        alone, helped_off = _helped_during(run)
    with waiters_help(True):
        shared, helped = _helped_during(run)
    assert helped_off == 0
    if BLOCKING:
        assert helped == 0
    else:
        assert helped > 0
    for r in alone + shared:
        assert torch.equal(r.cpu(), alone[0].cpu())
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1e-5}
    expected = fn(x.float(), grad.float()).to(dtype)
    torch.testing.assert_close(shared[0].cpu(), expected, **tol)


def test_an_idle_worker_helps_a_compiled_graph() -> None:
    torch.manual_seed(1)
    a, b = torch.randn(512, 1024), torch.randn(1024, 1024)
    x, w = a.to(DEV), b.to(DEV)
    (x + 1).sum().item()  # an eager launch: the stream's worker exists (asynchronous mode)
    graph = torch.compile(lambda p, q: torch.relu(p @ q), backend="neuron")
    graph(x, w)  # compiles
    with waiters_help(True):
        results, helped = _helped_during(lambda: [graph(x, w) for _ in range(4)])
    with waiters_help(False):
        alone, helped_off = _helped_during(lambda: graph(x, w))
    assert helped_off == 0
    if BLOCKING:
        assert helped == 0
    else:
        assert helped > 0  # the graph runs on this thread; the worker was idle
    for r in results:
        assert torch.equal(r.cpu(), alone.cpu())
    torch.testing.assert_close(alone.cpu(), torch.relu(a @ b), rtol=1e-4, atol=1e-3)


_ONLY_COMPILED_PROGRAM = """
import torch, torchneuron
from torchneuron import _C
torch.manual_seed(1)
a, b = torch.randn(512, 1024), torch.randn(1024, 1024)
x, w = a.to("neuron"), b.to("neuron")  # copies: nothing is launched on a stream
graph = torch.compile(lambda p, q: torch.relu(p @ q), backend="neuron")
graph(x, w)  # compiles
torch.neuron.synchronize()
before = _C._helped_tasks()
results = [graph(x, w) for _ in range(4)]
torch.neuron.synchronize()
helped = _C._helped_tasks() - before
expected = torch.relu(a @ b)
for r in results:
    torch.testing.assert_close(r.cpu(), expected, rtol=1e-4, atol=1e-3)
print("blocking", int(_C._launch_blocking()), "helped", helped)
"""


def test_a_program_that_only_runs_compiled_graphs_gets_a_helper() -> None:
    """Regression: the stream worker started only with the first eager launch, so a program
    whose eager ops were all too small to launch ran its compiled graphs on one core."""
    result = run_python(_ONLY_COMPILED_PROGRAM)
    assert result.returncode == 0, result.stderr
    fields = result.stdout.split()
    blocking, helped = int(fields[fields.index("blocking") + 1]), int(fields[-1])
    if blocking:
        assert helped == 0  # no worker exists in blocking mode
    else:
        assert helped > 0


def test_switching_sharing_off_and_on() -> None:
    with waiters_help(False):
        assert C._waiters_help() is False
    with waiters_help(True):
        assert C._waiters_help() is True
