"""Lazy runtime initialisation and fork safety for the neuron device."""

from __future__ import annotations

import threading
from collections.abc import Callable

from .. import _C

_lock = threading.Lock()
_initialized = False
_queued_calls: list[Callable[[], None]] = []


def _is_in_bad_fork() -> bool:
    """True in a child forked after the parent initialised the neuron runtime."""
    return _C._in_bad_fork()


def is_initialized() -> bool:
    return _initialized and not _is_in_bad_fork()


def _lazy_init() -> None:
    global _initialized
    if is_initialized():
        return
    with _lock:
        if is_initialized():
            return
        if _is_in_bad_fork():
            raise RuntimeError(
                "Cannot re-initialize neuron in a forked subprocess: the parent process "
                "initialised the Neuron runtime before fork(). To use neuron with "
                "multiprocessing, use the 'spawn' start method "
                "(torch.multiprocessing.set_start_method('spawn'))."
            )
        _C._init()  # raises the runtime's configuration error, if any
        calls, _queued_calls[:] = list(_queued_calls), []
        _initialized = True
        for call in calls:
            call()
    from .stats_publisher import maybe_start_from_environment

    # Opt-in (TORCHNEURON_STATS=1): for python -m torchneuron.fidelity.top.
    maybe_start_from_environment()


def _lazy_call(callable_: Callable[[], None]) -> None:
    """Runs callable_ now if initialised, else at initialisation (as torch.cuda does)."""
    if is_initialized():
        callable_()
    else:
        with _lock:
            _queued_calls.append(callable_)


def init() -> None:
    """Initialises the neuron runtime (normally done on first use)."""
    _lazy_init()
