"""A clean interpreter exit after backward passes on neuron, and after launched work.

PyTorch runs the backward work of a device on that device's autograd thread
(``pt_autograd_<index>``). Each backward carries a copy of the caller's thread-local state,
which holds a Python object (the ``contextvars`` context that
``torch.autograd.graph._engine_run_backward`` stashes). The device thread releases that copy
just *after* it has told the caller the backward is done; if the interpreter is already
finalizing, the release needs the GIL, the thread is told to exit while inside a noexcept
destructor, and the process aborts ("terminate called without an active exception", exit
code 134). CUDA has the same window; on a host device it is short enough to hit often.

At exit (before finalization) we queue one tiny backward on every device thread that
exists, through the engine directly so that nothing Python is stashed. A device thread
releases the previous backward's state before it takes the next task, so once ours has
completed no thread can still hold Python objects, and ours holds none.
"""

from __future__ import annotations

import atexit
import os
import warnings

import torch

_THREAD_PREFIX = "pt_autograd_"


def _device_thread_indices() -> list[int]:
    """Indices of the autograd device threads of this process (from /proc)."""
    indices = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return indices
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as f:
                name = f.read().strip()
        except OSError:
            continue
        if name.startswith(_THREAD_PREFIX) and name[len(_THREAD_PREFIX) :].isdigit():
            indices.append(int(name[len(_THREAD_PREFIX) :]))
    return sorted(set(indices))


def drain_device_threads() -> None:
    """Runs one backward on each neuron device whose autograd thread exists."""
    try:
        if not torch.neuron.is_initialized():
            return
        count = torch.neuron.device_count()
    except Exception:  # noqa: BLE001 - a broken configuration has nothing to drain
        return
    engine = torch.autograd.Variable._execution_engine
    for index in _device_thread_indices():
        if index >= count:
            continue
        try:
            leaf = torch.zeros(1, device=torch.device("neuron", index), requires_grad=True)
            root = (leaf * 2).sum()
            engine.run_backward((root,), (torch.ones_like(root),), False, False, (), True, True)
        except Exception:  # noqa: BLE001 - never turn exit into an error
            continue


def finish_launched_work() -> None:
    """Lets launched ops finish before the interpreter finalizes: a stream worker must not
    run a kernel while the libraries it uses unload. An error that work hit is reported as
    a warning (there is no caller left to raise it in)."""
    try:
        if torch.neuron.is_initialized():
            from .. import _C

            _C._wait_for_device_work()
    except Exception as error:  # noqa: BLE001 - reported, exit goes on
        warnings.warn(f"neuron: launched work failed before exit: {error}", stacklevel=1)


def install() -> None:
    # atexit runs last-registered first: the drain's backward passes launch work too.
    atexit.register(finish_launched_work)
    atexit.register(drain_device_threads)
