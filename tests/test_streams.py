"""Streams and events on neuron: torch.neuron.Stream/Event, torch.Stream/torch.Event."""

from __future__ import annotations

import time

import pytest
import torch

EXACT = {"rtol": 0, "atol": 0}


def test_default_and_current_stream():
    default = torch.neuron.default_stream()
    current = torch.neuron.current_stream()
    assert current == default
    assert default.device == torch.device("neuron:0")
    assert torch.neuron.default_stream(1).device == torch.device("neuron:1")
    assert torch.neuron.current_stream(torch.device("neuron:2")).device_index == 2
    assert isinstance(default, torch.Stream)


def test_new_streams_are_distinct():
    a = torch.neuron.Stream()
    b = torch.neuron.Stream()
    assert a != b
    assert a != torch.neuron.default_stream()
    assert a.device == torch.device("neuron:0")
    assert torch.neuron.Stream(device=1).device == torch.device("neuron:1")
    assert torch.neuron.Stream(device="neuron:3").device_index == 3


def test_set_stream():
    side = torch.neuron.Stream()
    torch.neuron.set_stream(side)
    assert torch.neuron.current_stream() == side
    assert torch.accelerator.current_stream() == side
    torch.neuron.set_stream(torch.neuron.default_stream())
    assert torch.neuron.current_stream() == torch.neuron.default_stream()


def test_stream_context_manager_nests_and_restores():
    s1 = torch.neuron.Stream()
    s2 = torch.neuron.Stream()
    with torch.neuron.stream(s1):
        assert torch.neuron.current_stream() == s1
        with torch.neuron.stream(s2):
            assert torch.neuron.current_stream() == s2
        assert torch.neuron.current_stream() == s1
    assert torch.neuron.current_stream() == torch.neuron.default_stream()
    with torch.neuron.stream(None):
        assert torch.neuron.current_stream() == torch.neuron.default_stream()


def test_stream_as_context_manager_itself():
    s = torch.neuron.Stream()
    with s:
        assert torch.neuron.current_stream() == s
    assert torch.neuron.current_stream() == torch.neuron.default_stream()


def test_streams_are_per_device():
    s1 = torch.neuron.Stream(device=1)
    with torch.neuron.stream(s1):
        assert torch.neuron.current_stream(1) == s1
        assert torch.neuron.current_stream(0) == torch.neuron.default_stream(0)
    assert torch.neuron.current_stream(1) == torch.neuron.default_stream(1)


def test_work_on_side_stream_is_correct():
    torch.manual_seed(0)
    a = torch.randn(64, 64)
    x = a.to("neuron")
    side = torch.neuron.Stream()
    side.wait_stream(torch.neuron.current_stream())
    with torch.neuron.stream(side):
        y = x @ x + 1
    torch.neuron.current_stream().wait_stream(side)
    torch.testing.assert_close(y.cpu(), a @ a + 1, rtol=1e-5, atol=1e-5)
    side.synchronize()
    assert side.query()


def test_event_record_query_synchronize():
    s = torch.neuron.Stream()
    event = torch.neuron.Event()
    with torch.neuron.stream(s):
        x = torch.ones(1000, device="neuron") * 3
        event.record()
    event.synchronize()
    assert event.query()
    assert x.sum().item() == 3000.0
    torch.neuron.current_stream().wait_event(event)
    default_event = torch.neuron.Event()
    default_event.record(torch.neuron.default_stream())
    default_event.wait(s)
    default_event.synchronize()
    assert default_event.query()


def test_record_event_from_stream():
    s = torch.neuron.Stream()
    event = s.record_event()
    event.synchronize()
    assert event.query()
    assert event.device == torch.device("neuron:0")


def test_event_elapsed_time_torch_event():
    start = torch.Event(device="neuron", enable_timing=True)
    end = torch.Event(device="neuron", enable_timing=True)
    start.record()
    time.sleep(0.05)
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 40.0  # milliseconds; only a loose lower bound


def test_event_elapsed_time_neuron_event():
    start = torch.neuron.Event(enable_timing=True)
    end = torch.neuron.Event(enable_timing=True)
    start.record()
    time.sleep(0.05)
    end.record()
    end.synchronize()
    elapsed = start.elapsed_time(end)
    assert isinstance(elapsed, float)
    assert elapsed >= 40.0  # milliseconds; only a loose lower bound


def test_elapsed_time_needs_timing_events():
    start = torch.Event(device="neuron")
    end = torch.Event(device="neuron")
    start.record()
    end.record()
    end.synchronize()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing"):
        start.elapsed_time(end)


def test_torch_stream_generic_api():
    s = torch.Stream(device="neuron")
    assert s.device == torch.device("neuron:0")
    assert s != torch.accelerator.current_stream()
    with s:
        assert torch.accelerator.current_stream() == s
        y = torch.arange(10.0, device="neuron") * 2
    s.synchronize()
    assert s.query()
    assert y.cpu().tolist() == [float(2 * i) for i in range(10)]
    s1 = torch.Stream(device="neuron:1")
    assert s1.device_index == 1
    event = torch.Event(device="neuron")
    event.record(s)
    s1.wait_event(event)
    event.synchronize()
    assert event.query()


def test_synchronize_all_streams():
    streams = [torch.neuron.Stream() for _ in range(3)]
    outs = []
    for i, s in enumerate(streams):
        with torch.neuron.stream(s):
            outs.append(torch.full((100,), float(i), device="neuron") + 1)
    torch.neuron.synchronize()
    assert all(s.query() for s in streams)
    assert [o.sum().item() for o in outs] == [100.0, 200.0, 300.0]


def test_accelerator_stream_functions():
    s = torch.neuron.Stream()
    torch.accelerator.set_stream(s)
    assert torch.neuron.current_stream() == s
    torch.accelerator.synchronize()
    torch.accelerator.set_stream(torch.neuron.default_stream())
    assert torch.accelerator.current_stream() == torch.neuron.default_stream()
