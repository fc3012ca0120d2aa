"""The profilers on neuron: torch.autograd.profiler (legacy device events), torch.profiler
(Kineto, with the neuron device timeline) and memory profiling.

Reference points: device time is bounded by the wall time measured around the profiled
region; a kernel run on the launching thread lies inside the CPU op that launched it (one
launched to a stream worker is credited to that op and starts inside it); memory events match
a known allocation byte for byte.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
from conftest import describe, run_python
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, record_function

import torchneuron

MIB = 1 << 20
# CPU op times come from PyTorch's approximate clock converted to Unix time, device times
# straight from the system clock: allow this much disagreement between the two timelines.
CLOCK_SLACK_US = 200.0


def _workload() -> torch.Tensor:
    x = torch.randn(128, 128, device="neuron")
    with record_function("region"):
        y = x @ x
        z = (y + 1).relu()
    return z.to("cpu")


def _may_launch_asynchronously(argument_bytes: int) -> bool:
    # The rule of csrc/aten/launch/async_launch.h: asynchronous unless NEURON_LAUNCH_BLOCKING=1, for
    # ops of at least TORCHNEURON_ASYNC_MIN_BYTES (or any op while work is pending).
    if torchneuron._C._launch_blocking():
        return False
    return argument_bytes >= int(os.environ.get("TORCHNEURON_ASYNC_MIN_BYTES", 256 * 1024))


def _warm_up() -> None:
    # First calls pay one-off costs (thread pools, Kineto's initialisation); keep them out of
    # the timed regions so the bounds below are about the profiler, not start-up.
    _workload()
    with torch.profiler.profile(activities=[ProfilerActivity.CPU]):
        _workload()


@pytest.fixture(scope="module", autouse=True)
def warm() -> None:
    _warm_up()


def _assert_sane_events(events, wall_us: float) -> None:
    for event in events:
        assert event.time_range.end >= event.time_range.start, event.name
        assert 0 <= event.cpu_time_total <= wall_us, (event.name, event.cpu_time_total)
        assert 0 <= event.device_time_total <= wall_us, (event.name, event.device_time_total)


def _row(averages, name: str, device_type: DeviceType = DeviceType.CPU):
    rows = [a for a in averages if a.key == name and a.device_type == device_type]
    assert len(rows) == 1, f"{name} on {device_type}: {[a.key for a in averages]}"
    return rows[0]


def test_legacy_profiler_reports_device_time(capfd: pytest.CaptureFixture[str]) -> None:
    # use_device without Kineto: device events on the current stream around every op.
    capfd.readouterr()
    start = time.perf_counter()
    with torch.autograd.profiler.profile(use_device="neuron") as prof:
        _workload()
    wall_us = (time.perf_counter() - start) * 1e6
    assert prof.profiler_kind == torch.autograd.ProfilerState.KINETO_PRIVATEUSE1_FALLBACK
    err = capfd.readouterr().err
    assert "INTERNAL ASSERT" not in err and "not enabled" not in err, err[-2000:]

    events = prof.function_events
    _assert_sane_events(events, wall_us)
    averages = prof.key_averages()
    mm = _row(averages, "aten::mm")
    assert 0 < mm.device_time_total <= wall_us
    # On the launching thread the kernel lies inside its op; a stream worker runs it after the
    # op returned, so its device time may then exceed the op's CPU time (the launch only).
    if not _may_launch_asynchronously(2 * 128 * 128 * 4):
        assert mm.device_time_total <= mm.cpu_time_total + CLOCK_SLACK_US
    region = _row(averages, "region")
    assert mm.device_time_total <= region.device_time_total <= wall_us
    table = averages.table(sort_by="device_time_total", row_limit=20)
    assert "aten::mm" in table and "Self NEURON" in table


def test_kineto_profiler_has_neuron_kernels_inside_their_ops() -> None:
    start = time.perf_counter()
    with torch.profiler.profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
    ) as prof:
        _workload()
    wall_us = (time.perf_counter() - start) * 1e6
    events = prof.events()
    _assert_sane_events(events, wall_us)

    kernels = [e for e in events if e.device_type == DeviceType.PrivateUse1]
    assert {"aten::mm", "aten::add", "aten::relu"} <= {k.name for k in kernels}
    assert all(k.device_index == 0 for k in kernels)
    total_device_us = sum(k.time_range.elapsed_us() for k in kernels)
    assert 0 < total_device_us <= wall_us

    # Each kernel is credited to the CPU op that launched it and starts inside that op; it
    # also ends inside it when it ran on the launching thread (blocking launches, or a small
    # op on an idle stream), and later when a stream worker ran it.
    cpu_mm = [e for e in events if e.name == "aten::mm" and e.device_type == DeviceType.CPU]
    assert len(cpu_mm) == 1 and len(cpu_mm[0].kernels) == 1
    mm_kernel = next(k for k in kernels if k.name == "aten::mm")
    assert mm_kernel.time_range.start >= cpu_mm[0].time_range.start - CLOCK_SLACK_US
    if not _may_launch_asynchronously(2 * 128 * 128 * 4):
        assert mm_kernel.time_range.end <= cpu_mm[0].time_range.end + CLOCK_SLACK_US
    assert cpu_mm[0].device_time_total == pytest.approx(mm_kernel.time_range.elapsed_us())

    averages = prof.key_averages()
    mm = _row(averages, "aten::mm")
    assert 0 < mm.self_device_time_total <= wall_us
    assert _row(averages, "aten::mm", DeviceType.PrivateUse1).count == 1
    region = _row(averages, "region")
    assert mm.device_time_total <= region.device_time_total <= wall_us
    if not _may_launch_asynchronously(2 * 128 * 128 * 4):
        assert mm.self_device_time_total <= mm.cpu_time_total + CLOCK_SLACK_US
        assert region.device_time_total <= region.cpu_time_total + CLOCK_SLACK_US
    table = averages.table(sort_by="self_device_time_total", row_limit=20)
    assert "aten::mm" in table and "Self NEURON" in table


def test_autograd_profiler_with_kineto_uses_the_device_timeline() -> None:
    with torch.autograd.profiler.profile(use_device="neuron", use_kineto=True) as prof:
        _workload()
    kernels = [e for e in prof.function_events if e.device_type == DeviceType.PrivateUse1]
    assert "aten::mm" in {k.name for k in kernels}
    assert all(k.time_range.elapsed_us() >= 0 for k in kernels)


def test_cpu_only_profile_has_no_device_rows() -> None:
    start = time.perf_counter()
    with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as prof:
        _workload()
    wall_us = (time.perf_counter() - start) * 1e6
    events = prof.events()
    _assert_sane_events(events, wall_us)
    assert not [e for e in events if e.device_type != DeviceType.CPU]
    assert _row(prof.key_averages(), "aten::mm").cpu_time_total > 0


def test_backward_kernels_on_the_autograd_thread_are_linked() -> None:
    w = torch.randn(64, 64, device="neuron", requires_grad=True)
    with torch.profiler.profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
    ) as prof:
        (w @ w).sum().backward()
    averages = prof.key_averages()
    # MmBackward0 runs two mm kernels on the autograd engine's neuron thread.
    assert _row(averages, "aten::mm", DeviceType.PrivateUse1).count == 3
    assert _row(averages, "aten::mm").device_time_total > 0
    assert _row(averages, "MmBackward0").device_time_total > 0


def _chrome_trace(prof, tmp_path: Path) -> list[dict]:
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    return json.loads(path.read_text())["traceEvents"]


def test_chrome_trace_has_neuron_rows(tmp_path: Path) -> None:
    start = time.perf_counter()
    with torch.profiler.profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
    ) as prof:
        _workload()
    wall_us = (time.perf_counter() - start) * 1e6
    events = _chrome_trace(prof, tmp_path)
    complete = [e for e in events if e.get("ph") == "X"]
    assert complete and all(e["dur"] >= 0 for e in complete)
    span = max(e["ts"] + e["dur"] for e in complete) - min(e["ts"] for e in complete)
    assert span <= wall_us

    kernels = [e for e in complete if e.get("cat") == "kernel"]
    assert "aten::mm" in {k["name"] for k in kernels}
    assert all(k["pid"] == 0 and k["args"]["stream"] == 0 for k in kernels)
    copies = [e for e in complete if e.get("cat") == "gpu_memcpy"]
    assert "Memcpy DtoH (Neuron -> Host)" in {c["name"] for c in copies}
    names = {
        e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name" and e.get("pid") == 0
    }
    assert names == {"neuron"}


def test_legacy_chrome_trace_times_are_inside_the_profile(tmp_path: Path) -> None:
    start = time.perf_counter()
    with torch.autograd.profiler.profile(use_device="neuron") as prof:
        _workload()
    wall_us = (time.perf_counter() - start) * 1e6
    complete = [e for e in _chrome_trace(prof, tmp_path) if e.get("ph") == "X"]
    assert complete and all(e["dur"] >= 0 for e in complete)
    span = max(e["ts"] + e["dur"] for e in complete) - min(e["ts"] for e in complete)
    assert span <= wall_us


def _neuron_memory_records(prof, device: int = 0) -> list[int]:
    return [
        e.nbytes()
        for e in prof.profiler.kineto_results.events()
        if e.name() == "[memory]"
        and e.device_type() == DeviceType.PrivateUse1
        and e.device_index() == device
    ]


def test_memory_events_report_neuron_allocations_and_frees() -> None:
    torch.neuron.synchronize()
    with torch.profiler.profile(
        activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1], profile_memory=True
    ) as prof:
        t = torch.empty(MIB // 4, dtype=torch.float32, device="neuron")  # exactly 1 MiB
        del t
        u = torch.empty(2 * MIB, dtype=torch.uint8, device="neuron:1")
        del u
    records = _neuron_memory_records(prof)
    assert records.count(MIB) == 1 and records.count(-MIB) == 1, records
    assert records.index(MIB) < records.index(-MIB)
    assert sum(records) == 0
    assert _neuron_memory_records(prof, device=1) == [2 * MIB, -2 * MIB]
    empties = [e for e in prof.events() if e.name == "aten::empty"]
    assert [e.device_memory_usage for e in empties] == [MIB, 2 * MIB]
    assert [e.cpu_memory_usage for e in empties] == [0, 0]


def test_memory_events_of_host_kernel_results() -> None:
    a = torch.ones(256, 256, device="neuron")  # 256 KiB
    with torch.profiler.profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        b = a + a  # the host kernel allocates its result in device memory
        del b
    records = _neuron_memory_records(prof)
    assert records == [256 * 1024, -256 * 1024], records
    assert _row(prof.key_averages(), "aten::add").device_memory_usage == 256 * 1024


@pytest.mark.launch_mode_independent
def test_legacy_profiler_with_a_broken_configuration_reports_it_once() -> None:
    # Device events cannot be recorded; a warning says why, once, and the profiler's closing
    # synchronize raises the runtime's configuration error. That leaves PyTorch's profiler
    # enabled, and PyTorch crashes destroying it at interpreter exit (its own teardown: a
    # CPU-only profiler left enabled does the same without torchneuron), so the child leaves
    # with os._exit.
    result = run_python(
        """
        import os, sys
        import torch
        x = torch.randn(32, 32)
        try:
            with torch.autograd.profiler.profile(use_device="neuron") as prof:
                y = x @ x
        except RuntimeError as error:
            print("raised:", error)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
        """,
        env={"NEURON_LOGICAL_NC_CONFIG": "7"},
    )
    assert result.returncode == 0, describe(result)
    assert 'raised: NEURON_LOGICAL_NC_CONFIG="7" is invalid' in result.stdout, describe(result)
    assert result.stderr.count("could not record a device event") == 1, describe(result)
    assert "INTERNAL ASSERT" not in result.stderr, describe(result)
