"""benchmarks/_harness.py: a baseline is measured while the device's threads sleep, and a
label whose blocks disagree is measured again, then reported as unstable, never as a ratio.

Block times come from a fake clock that each call advances by a prescribed amount, so the
checks do not depend on the host's load; the device-thread checks read the kernel's CPU
counters of the stream worker (named "neuron-stream" by csrc/runtime/stream.cpp).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

import torchneuron


def _load_harness() -> types.ModuleType:
    # Loaded from its file, not by putting benchmarks/ on sys.path: that folder holds nki.py,
    # which would then shadow the `nki` import alias the NKI tests install in this process.
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "_harness.py"
    spec = importlib.util.spec_from_file_location("_harness", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["_harness"] = module
    spec.loader.exec_module(module)
    return module


_harness = _load_harness()


def _thread_names() -> list[str]:
    names = []
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/comm") as f:
            names.append(f.read().strip())
    return names


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def calls_taking(self, seconds: list[float]) -> Callable[[], None]:
        """A function whose successive calls take these seconds (the last one repeats)."""
        durations: Iterator[float] = iter(seconds)
        last = [seconds[-1]]

        def call() -> None:
            last[0] = next(durations, last[0])
            self.now += last[0]

        return call


def test_steady_blocks_give_their_median_and_no_doubt() -> None:
    clock = FakeClock()
    fns = {"cpu": clock.calls_taking([2.0]), "neuron": clock.calls_taking([1.0])}
    medians = _harness.interleaved(fns, iterations=1, rounds=5, warmup=0, clock=clock)
    assert dict(medians) == {"cpu": 2.0, "neuron": 1.0}
    assert medians.doubt("cpu") is None and medians.doubt("neuron") is None
    assert medians.ratio_text("cpu", "neuron") == "2.000"


def test_disagreeing_blocks_are_measured_again_and_kept_if_they_then_agree() -> None:
    clock = FakeClock()
    # The first five cpu blocks: one 7x slower (what a burst of other load does); then steady.
    cpu = clock.calls_taking([1.0, 7.0, 1.0, 1.0, 1.0] + [1.0] * 5)
    calls = []
    fns = {"cpu": lambda: (calls.append(1), cpu()), "neuron": clock.calls_taking([1.0])}
    medians = _harness.interleaved(fns, iterations=1, rounds=5, warmup=0, clock=clock)
    assert len(calls) == 10  # five rounds, then five more
    assert medians["cpu"] == 1.0 and medians.doubt("cpu") is None


def test_blocks_that_still_disagree_are_unstable_not_a_ratio(capsys) -> None:
    clock = FakeClock()
    fns = {"cpu": clock.calls_taking([1.0, 3.0] * 10), "neuron": clock.calls_taking([1.0])}
    medians = _harness.interleaved(fns, iterations=1, rounds=4, warmup=0, clock=clock)
    assert medians.unstable == {"cpu": 3.0}
    assert medians.ratio_text("cpu", "neuron") == "unstable"
    assert medians.doubt("neuron") is None
    assert "not a measurement: cpu: blocks 3.00x apart" in capsys.readouterr().err


def test_a_baseline_block_with_device_threads_running_is_measured_again(monkeypatch) -> None:
    clock = FakeClock()
    used = [0.0]
    # The device's threads run 0.5 s during the first two baseline blocks, then sleep.
    runs = iter([0.5, 0.5])

    def baseline() -> None:
        clock.now += 1.0
        used[0] += next(runs, 0.0)

    monkeypatch.setattr(_harness, "device_thread_cpu", lambda: used[0])
    blocks = []
    fns = {"cpu": lambda: (blocks.append(1), baseline()), "neuron": clock.calls_taking([1.0])}
    medians = _harness.interleaved(fns, iterations=1, rounds=3, warmup=0, clock=clock)
    assert len(blocks) == 3 + 2  # the two disturbed blocks measured again
    assert medians.doubt("cpu") is None


def test_a_baseline_always_disturbed_is_flagged(monkeypatch) -> None:
    clock = FakeClock()
    used = [0.0]

    def baseline() -> None:
        clock.now += 1.0
        used[0] += 0.3  # a spinning device thread: 30% of every block

    monkeypatch.setattr(_harness, "device_thread_cpu", lambda: used[0])
    fns = {"cpu": baseline, "neuron": clock.calls_taking([1.0])}
    medians = _harness.interleaved(fns, iterations=1, rounds=3, warmup=0, clock=clock)
    assert medians.disturbed == {"cpu": pytest.approx(0.3)}
    assert medians.ratio_text("neuron", "cpu") == "unstable"


def test_the_stream_worker_is_counted_and_sleeps_while_the_cpu_works() -> None:
    # Device work big enough for the worker to run for several clock ticks.
    x = torch.randn(512, 512, device="neuron")
    before = _harness.device_thread_cpu()
    for _ in range(40):
        x = torch.tanh(x @ x)
    torch.neuron.synchronize()
    if torchneuron._C._launch_blocking():  # every op inline: no worker thread exists
        assert _harness.DEVICE_THREAD_NAME not in _thread_names()
        return
    assert _harness.DEVICE_THREAD_NAME in _thread_names()
    assert _harness.device_thread_cpu() > before  # the worker is found and its time read

    # Then CPU work only, as a baseline block runs: the idle worker must not use the CPU.
    a = torch.randn(512, 512)
    idle_from = _harness.device_thread_cpu()
    for _ in range(60):
        a = torch.tanh(a @ a)
    assert _harness.device_thread_cpu() - idle_from <= 2 * _harness._TICK
