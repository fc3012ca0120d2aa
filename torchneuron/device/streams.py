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

    # torch.Stream's methods accept None (and read other objects loosely): check first.
    def wait_event(self, event: torch.Event) -> None:
        """Makes this stream wait for event."""
        super().wait_event(_event(event, "Stream.wait_event"))

    def wait_stream(self, stream: torch.Stream) -> None:
        """Makes this stream wait for the work queued on stream so far."""
        checked = _neuron_stream_or_none(stream, "Stream.wait_stream")
        if checked is None:
            raise TypeError("Stream.wait_stream expects a torch.neuron.Stream, got None.")
        super().wait_stream(checked)

    def record_event(self, event: torch.Event | None = None) -> torch.Event:
        """Records event (a new one when None) on this stream and returns it."""
        if event is not None:
            _event(event, "Stream.record_event")
        return super().record_event(event)


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

    def record(self, stream: torch.Stream | None = None) -> None:
        """Records the event on stream (default: the current stream)."""
        super().record(_neuron_stream_or_none(stream, "Event.record"))

    def wait(self, stream: torch.Stream | None = None) -> None:
        """Makes stream (default: the current stream) wait for this event."""
        super().wait(_neuron_stream_or_none(stream, "Event.wait"))

    def elapsed_time(self, end_event: torch.Event) -> float:
        """Milliseconds between this event and end_event (both recorded, with timing)."""
        if not isinstance(end_event, torch.Event):
            raise TypeError(
                f"elapsed_time expects a torch.neuron.Event, got {type(end_event).__name__}."
            )
        # torch.Event.elapsed_time accepts only exact torch.Event objects, not subclasses.
        if self.event_id == 0 or end_event.event_id == 0:
            raise RuntimeError("Both events must be recorded before measuring elapsed time.")
        return _C._event_elapsed_ms(self.event_id, end_event.event_id)


def _event(event: object, what: str) -> torch.Event:
    if not isinstance(event, torch.Event):
        raise TypeError(f"{what} expects a torch.neuron.Event, got {type(event).__name__}.")
    return event


def _neuron_stream_or_none(stream: object, what: str) -> torch.Stream | None:
    """stream if it is a neuron stream or None; a clear TypeError/ValueError otherwise (torch.
    Event would read an int as a device type and a CPU stream as a mismatched device)."""
    if stream is None:
        return None
    if not isinstance(stream, torch.Stream):
        raise TypeError(f"{what} expects a torch.neuron.Stream, got {type(stream).__name__}.")
    if stream.device.type != "neuron":
        raise ValueError(f"{what} expects a neuron stream, got a stream of {stream.device}.")
    return stream


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
    if _neuron_stream_or_none(stream, "set_stream") is None:
        raise TypeError("set_stream expects a torch.neuron.Stream, got None.")
    torch.accelerator.set_stream(stream)


class StreamContext:
    """Context manager that makes a stream current and restores the previous one."""

    def __init__(self, stream: torch.Stream | None) -> None:
        self.stream = _neuron_stream_or_none(stream, "torch.neuron.stream")
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
