"""The interpreter exits cleanly right after a backward pass on neuron.

Without the exit drain (torchneuron/device/autograd_exit.py) a device autograd thread could release
the backward's Python state during finalization and abort the process (exit code 134, about
3 runs in 10 on a 2-core machine); ten runs all exiting 0 is the check.
"""

from __future__ import annotations

import torch
from conftest import Pending

from torchneuron.device import autograd_exit

BACKWARD_THEN_EXIT = """
import torch
for index in (0, 1):
    x = torch.randn(3, device=f"neuron:{index}", requires_grad=True)
    (x * 2).sum().backward()
    assert torch.equal(x.grad.cpu(), torch.full((3,), 2.0))
print("done")
"""


def test_exit_after_backward_is_clean():
    runs = [Pending(BACKWARD_THEN_EXIT) for _ in range(10)]
    results = [run.result() for run in runs]
    codes = [r.returncode for r in results]
    assert codes == [0] * 10, [(r.returncode, r.stderr[-300:]) for r in results if r.returncode]
    assert all(r.stdout.strip() == "done" for r in results)


def test_drain_reaches_every_device_thread():
    x = torch.randn(3, device="neuron:1", requires_grad=True)
    (x * 2).sum().backward()
    assert 1 in autograd_exit._device_thread_indices()
    autograd_exit.drain_device_threads()  # runs, and leaves autograd usable
    y = torch.randn(3, device="neuron:1", requires_grad=True)
    (y * 3).sum().backward()
    assert torch.equal(y.grad.cpu(), torch.full((3,), 3.0))
