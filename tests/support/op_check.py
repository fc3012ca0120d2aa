"""Checking an op on neuron against the CPU: forward results, mutated inputs and input
gradients, with the tolerances the op tests share."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

# The neuron device runs PyTorch's CPU kernels over device memory, so float32 results are
# expected to match the CPU closely; these are float32 tolerances all the same.
FP32 = {"rtol": 1e-5, "atol": 1e-5}
BF16 = {"rtol": 1.6e-2, "atol": 1e-2}
FP16 = {"rtol": 1e-3, "atol": 1e-3}
EXACT = {"rtol": 0, "atol": 0}

DEVICE = torch.device("neuron:0")


class Const:
    """Wraps an input that must not require grad (buffers, indices-like floats)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def pos(*shape: int) -> torch.Tensor:
    return torch.rand(*shape) + 0.5


def idx(high: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, high, shape)


def flat(out: object) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, Sequence):  # tuples, lists, named tuples
        return [t for item in out for t in flat(item)]
    return []


def prepare(inputs: list, device: torch.device | str, grad: bool) -> tuple[list, list]:
    args, leaves = [], []
    for item in inputs:
        if isinstance(item, Const):
            args.append(item.tensor.detach().clone().to(device))
        elif isinstance(item, torch.Tensor):
            t = item.detach().clone().to(device)
            if grad and t.is_floating_point():
                t.requires_grad_(True)
                leaves.append(t)
            args.append(t)
        else:
            args.append(item)
    return args, leaves


def check(fn: Callable, inputs: list, tol: dict | None = None, grad: bool = True) -> None:
    """Runs fn on CPU and on neuron; compares outputs, then input gradients."""
    tol = tol or FP32
    cpu_args, cpu_leaves = prepare(inputs, "cpu", grad)
    dev_args, dev_leaves = prepare(inputs, DEVICE, grad)
    cpu_out = flat(fn(*cpu_args))
    dev_out = flat(fn(*dev_args))
    assert len(cpu_out) == len(dev_out) > 0
    for c, d in zip(cpu_out, dev_out, strict=True):
        assert d.device == DEVICE, f"result on {d.device}"
        assert d.dtype == c.dtype
        torch.testing.assert_close(d.detach().cpu(), c.detach(), **tol)
    # Mutated inputs (in-place ops, buffers) must match too.
    for c, d in zip(cpu_args, dev_args, strict=True):
        if isinstance(c, torch.Tensor):
            torch.testing.assert_close(d.detach().cpu(), c.detach(), **tol)
    if not grad or not cpu_leaves:
        return
    pairs = [(c, d) for c, d in zip(cpu_out, dev_out, strict=True) if c.requires_grad]
    if not pairs:
        return
    generator = torch.Generator().manual_seed(1234)
    cpu_loss = 0.0
    dev_loss = 0.0
    for c, d in pairs:
        w = torch.randn(c.shape, generator=generator, dtype=c.dtype)
        cpu_loss = cpu_loss + (c * w).sum()
        dev_loss = dev_loss + (d * w.to(DEVICE)).sum()
    cpu_loss.backward()
    dev_loss.backward()
    for c, d in zip(cpu_leaves, dev_leaves, strict=True):
        assert (c.grad is None) == (d.grad is None)
        if c.grad is not None:
            assert d.grad.device == DEVICE
            torch.testing.assert_close(d.grad.cpu(), c.grad, **tol)
