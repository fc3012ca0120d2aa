"""Point-to-point traffic and torch.distributed.pipelining on `neuron`, against CPU/gloo.

P2P moves bytes and computes nothing, so received tensors must equal what was sent, bit for
bit, in every launch mode. The pipeline schedules compute: their gradients are compared with
the same program on CPU tensors over Gloo, bitwise, under TORCHNEURON_NATIVE_KERNELS=0 (the
device then runs PyTorch's CPU kernels, so any difference is data lost or reordered in
transit; the native kernels' own rounding is tested by their own tests). Both transports of
the neuron group (shared memory and Gloo) and 2 and 4 ranks are covered.

The defect these guard against: an isend's caller may drop its last reference to the tensor
at once (pipelining's backward does), and the bytes handed to Gloo must stay allocated until
the transfer ends, or the caching allocator gives them to the next tensor mid-send.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pytest
import torch
from support.ranks import run_ranks

WIDTH = 512  # features per layer: 1 MiB weights, activations of 4 x 512 floats per microbatch
MICROBATCHES = 8
LOSS_SCALE = 1024.0  # a loss scale as GradScaler applies it: gradients grow by this factor


# --- point to point ----------------------------------------------------------------------

P2P_ROUNDS = 24
P2P_ELEMENTS = 1 << 18  # 1 MiB per tensor: above the asynchronous-launch threshold


def _p2p_stress(rank: int, size: int) -> int:
    """Every rank sends to its right neighbour and receives from its left, through send/recv,
    isend/irecv and batch_isend_irecv. Each sent tensor loses its last reference as soon as
    its send is posted, and a new tensor of the same size is filled at once (on the stream
    worker when launches are asynchronous), so a send that does not keep its bytes alive
    transmits the new tensor's fill. Receives are checked against the closed form."""
    import torch.distributed as dist

    dev = torch.device("neuron", torch.neuron.current_device())
    right, left = (rank + 1) % size, (rank - 1) % size
    pending, received = [], []
    for i in range(P2P_ROUNDS):
        value = float(1000 * rank + i)
        incoming = torch.empty(P2P_ELEMENTS, device=dev)
        outgoing = torch.arange(P2P_ELEMENTS, device=dev, dtype=torch.float32) + value
        if i % 3 == 0:
            ops = [dist.P2POp(dist.isend, outgoing, right), dist.P2POp(dist.irecv, incoming, left)]
            pending += dist.batch_isend_irecv(ops)
            del ops
        elif i % 3 == 1:
            pending.append(dist.isend(outgoing, right))
            pending.append(dist.irecv(incoming, left))
        else:  # blocking pair, ordered by rank parity so the ring cannot deadlock
            if rank % 2 == 0:
                dist.send(outgoing, right)
                dist.recv(incoming, left)
            else:
                dist.recv(incoming, left)
                dist.send(outgoing, right)
        del outgoing
        # takes the block a freed send tensor left, and writes it while Gloo may still send
        torch.full((P2P_ELEMENTS,), -1.0, device=dev).add_(1.0)
        received.append(incoming)
    for work in pending:
        work.wait()
    base = torch.arange(P2P_ELEMENTS, dtype=torch.float32)
    for i, incoming in enumerate(received):
        expected = base + float(1000 * left + i)
        assert torch.equal(incoming.cpu(), expected), (
            f"round {i}: received {incoming[:4].cpu().tolist()}..., "
            f"expected {expected[:4].tolist()}..."
        )
    return len(received)


@pytest.mark.parametrize(
    "launch",
    [{}, {"NEURON_LAUNCH_BLOCKING": "1"}, {"TORCHNEURON_ASYNC_MIN_BYTES": "0"}],
    ids=["default", "blocking", "all-async"],
)
def test_p2p_keeps_sent_tensors_alive_under_reuse(launch, monkeypatch):
    for name, value in launch.items():
        monkeypatch.setenv(name, value)
    assert run_ranks(_p2p_stress, 2, "neuron") == {0: P2P_ROUNDS, 1: P2P_ROUNDS}


# --- pipeline schedules ------------------------------------------------------------------


def _stage_module(index: int, device: torch.device) -> torch.nn.Module:
    """Stage `index` of the reference model: equal on every rank and backend for one index."""
    gen = torch.Generator().manual_seed(1234 + index)
    module = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh(), torch.nn.Linear(WIDTH, WIDTH)
    )
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * WIDTH**-0.5)
    return module.to(device)


def _scaled_mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((output - target) ** 2).mean() * LOSS_SCALE


# schedule name -> (local stage indices of a rank: fn(rank, size), class name)
SCHEDULES: dict[str, tuple[Callable[[int, int], list[int]], str]] = {
    "GPipe": (lambda r, s: [r], "ScheduleGPipe"),
    "1F1B": (lambda r, s: [r], "Schedule1F1B"),
    "Interleaved1F1B": (lambda r, s: [r, r + s], "ScheduleInterleaved1F1B"),
    "LoopedBFS": (lambda r, s: [r, r + s], "ScheduleLoopedBFS"),
    "InterleavedZeroBubble": (lambda r, s: [r, r + s], "ScheduleInterleavedZeroBubble"),
    "ZBVZeroBubble": (lambda r, s: [r, 2 * s - 1 - r], "ScheduleZBVZeroBubble"),
    "DualPipeV": (lambda r, s: [r, 2 * s - 1 - r], "ScheduleDualPipeV"),
}


def _pipeline_step(rank: int, size: int, device_type: str, names: list[str]) -> bytes:
    """One training step of each schedule; returns per schedule the gradients of this rank's
    stages and the losses the last stage saw, saved by torch.save (tensors put on a
    multiprocessing queue are shared by descriptors that close when the rank exits)."""
    from torch.distributed import pipelining

    device = torch.device("cpu")
    if device_type == "neuron":
        device = torch.device("neuron", torch.neuron.current_device())
    gen = torch.Generator().manual_seed(7)
    batch = 4 * MICROBATCHES
    inputs = torch.randn(batch, WIDTH, generator=gen)
    target = torch.randn(batch, WIDTH, generator=gen)
    out: dict[str, Any] = {}
    for name in names:
        local_of, class_name = SCHEDULES[name]
        indices = local_of(rank, size)
        n_stages = size * len(indices)
        stages = [
            pipelining.PipelineStage(_stage_module(i, device), i, n_stages, device) for i in indices
        ]
        cls = getattr(pipelining, class_name)
        schedule = cls(
            stages if len(stages) > 1 else stages[0],
            n_microbatches=MICROBATCHES,
            loss_fn=_scaled_mse,
        )
        losses: list[torch.Tensor] = []
        holds_first = 0 in indices
        holds_last = n_stages - 1 in indices
        schedule.step(
            *([inputs.to(device)] if holds_first else []),
            target=target.to(device) if holds_last else None,
            losses=losses if holds_last else None,
        )
        out[name] = {
            "grads": {
                f"{s.stage_index}.{k}": p.grad.detach().cpu()
                for s in stages
                for k, p in s.submod.named_parameters()
            },
            "losses": [loss.detach().cpu() for loss in losses],
        }
    buffer = io.BytesIO()
    torch.save(out, buffer)
    return buffer.getvalue()


def _load(saved: dict[int, bytes]) -> dict[int, Any]:
    return {rank: torch.load(io.BytesIO(data)) for rank, data in saved.items()}


def _compare(reference: dict[int, Any], device: dict[int, Any]) -> list[str]:
    problems = []
    for rank, by_schedule in reference.items():
        for name, ref in by_schedule.items():
            got = device[rank][name]
            for key, expected in ref["grads"].items():
                if not torch.equal(got["grads"][key], expected):
                    err = (got["grads"][key] - expected).abs().max().item()
                    problems.append(f"{name} rank {rank} grad {key}: max error {err:.3g}")
            for i, (a, b) in enumerate(zip(got["losses"], ref["losses"], strict=True)):
                if not torch.equal(a, b):
                    problems.append(f"{name} rank {rank} loss {i}: {a.item()} != {b.item()}")
    return problems


@pytest.fixture(scope="module")
def cpu_references() -> dict[int, dict[int, Any]]:
    """The same programs on CPU tensors over Gloo, once per world size."""
    return {
        size: _load(run_ranks(_pipeline_step, size, "gloo", "cpu", list(SCHEDULES)))
        for size in (2, 4)
    }


@pytest.mark.parametrize(
    ("size", "transport"), [(2, "shm"), (2, "gloo"), (4, "shm")], ids=["2-shm", "2-gloo", "4-shm"]
)
def test_every_schedule_gives_the_cpu_gradients(size, transport, cpu_references, monkeypatch):
    monkeypatch.setenv("TORCHNEURON_NATIVE_KERNELS", "0")
    monkeypatch.setenv("TORCHNEURON_DIST_TRANSPORT", transport)
    got = _load(run_ranks(_pipeline_step, size, "neuron", "neuron", list(SCHEDULES)))
    problems = _compare(cpu_references[size], got)
    assert not problems, "\n".join(problems)
