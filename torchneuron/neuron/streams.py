"""Streams and events for torch.neuron, built on torch.Stream and torch.Event."""

from __future__ import annotations

from typing import Any

import torch

from .. import _C
from ._device import DeviceLike, _get_device_index
from ._lazy import _lazy_init


class Stream(torch.Stream):
    """An in-order queue of work on a neuron device."""

    def __new__(cls, device: DeviceLike = None, priority: int = 0, **kwargs: Any) -> Stream:
        _lazy_init()
        if "stream_id" in kwargs:  # wrapping an existing stream
            return super().__new__(cls, **kwargs)
        index = _get_device_index(device)
        return super().__new__(cls, device=torch.device("neuron", index), priority=priority)


class Event(torch.Event):
    """Marks a point in a stream: synchronisation and elapsed-time measurement."""

    def __new__(
        cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> Event:
        _lazy_init()
        return super().__new__(
            cls,
            device=torch.device("neuron"),
            enable_timing=enable_timing,
            blocking=blocking,
            interprocess=interprocess,
        )

    def elapsed_time(self, end_event: torch.Event) -> float:
        """Milliseconds between this event and end_event (both recorded, with timing)."""
        # torch.Event.elapsed_time accepts only exact torch.Event objects, not subclasses.
        if self.event_id == 0 or end_event.event_id == 0:
            raise RuntimeError("Both events must be recorded before measuring elapsed time.")
        return _C._event_elapsed_ms(self.event_id, end_event.event_id)


def _wrap(stream: torch.Stream) -> Stream:
    return Stream(
        stream_id=stream.stream_id,
        device_index=stream.device_index,
        device_type=stream.device_type,
    )


def current_stream(device: DeviceLike = None) -> Stream:
    _lazy_init()
    return _wrap(
        torch.accelerator.current_stream(torch.device("neuron", _get_device_index(device)))
    )


def default_stream(device: DeviceLike = None) -> Stream:
    _lazy_init()
    index = _get_device_index(device)
    current = torch.accelerator.current_stream(torch.device("neuron", index))
    return Stream(stream_id=0, device_index=index, device_type=current.device_type)


def set_stream(stream: torch.Stream) -> None:
    """Makes stream the current stream of its device (for this thread)."""
    _lazy_init()
    torch.accelerator.set_stream(stream)


class StreamContext:
    """Context manager that makes a stream current and restores the previous one."""

    def __init__(self, stream: torch.Stream | None) -> None:
        self.stream = stream
        self.previous: torch.Stream | None = None

    def __enter__(self) -> None:
        if self.stream is None:
            return
        self.previous = torch.accelerator.current_stream(self.stream.device)
        torch.accelerator.set_stream(self.stream)

    def __exit__(self, *args: object) -> None:
        if self.previous is not None:
            torch.accelerator.set_stream(self.previous)


def stream(stream: torch.Stream | None) -> StreamContext:
    return StreamContext(stream)
