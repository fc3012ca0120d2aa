"""Fuzz targets for the torch.neuron module: device selection, memory, RNG, streams, events.

Device arguments are drawn from everything a caller might pass (None, ints of any size,
bools, floats, strings that are and are not devices, torch.device objects of any type and
index, bytes, lists, tensors). The meaning of a valid argument is known (None, "neuron" and
-1 mean the current device; an index in range, "neuron:N" or torch.device("neuron", N) mean
N), so an accepted argument must act on exactly that device, and every other argument must
be refused with an expected error.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from hypothesis import strategies as st

from .fuzz_oracle import Finding, Outcome, check_message, expect_error, expect_ok, run

INVALID = object()  # expected_index(): the argument names no device of this process

DEVICE_STRINGS = (
    "neuron", "neuron:0", "neuron:1", "neuron:3", "neuron:4", "neuron:127", "neuron:128",
    "neuron:-1", "neuron:-2", "neuron:1.5", "neuron:", ":0", "neuron:0:0", "NEURON:0",
    "neuron:00", "neuron:+1", " neuron:0", "cpu", "cpu:0", "cuda", "cuda:1", "meta",
    "privateuseone:0", "", "0", "1",
)  # fmt: skip


def device_arguments() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(),
        st.integers(-3, 6),
        st.integers(-(2**70), 2**70),
        st.sampled_from([127, 128, 255, 256, 1000, 2**31, 2**32, 2**63 - 1, 2**63, -(2**63)]),
        st.booleans(),
        st.floats(allow_nan=True),
        st.sampled_from(DEVICE_STRINGS),
        st.text(max_size=10),
        st.builds(torch.device, st.sampled_from(["neuron", "cpu", "meta"]), st.integers(0, 200)),
        st.sampled_from([torch.device("neuron"), torch.device("cpu")]),
        st.binary(max_size=4),
        st.lists(st.integers(0, 3), max_size=2),
        st.builds(torch.tensor, st.integers(0, 3)),
    )


def expected_index(arg: Any) -> Any:
    """The device index a valid argument means, or INVALID."""
    count = torch.neuron.device_count()
    current = torch.neuron.current_device()
    if arg is None:
        return current
    if isinstance(arg, bool) or not isinstance(arg, (int, str, torch.device)):
        return INVALID
    if isinstance(arg, str):
        try:
            arg = torch.device(arg)
        except (RuntimeError, ValueError, TypeError):
            return INVALID
    if isinstance(arg, torch.device):
        if arg.type != "neuron":
            return INVALID
        index = current if arg.index is None else arg.index
    else:
        index = current if arg == -1 else arg
    return index if 0 <= index < count else INVALID


DEVICE_FUNCTIONS = (
    "set_device", "device", "get_device_properties", "get_device_name",
    "get_device_capability", "synchronize", "memory_stats", "memory_allocated",
    "max_memory_allocated", "memory_reserved", "max_memory_reserved", "reset_peak_memory_stats",
    "reset_accumulated_memory_stats", "reset_max_memory_allocated", "mem_get_info",
    "memory_summary", "get_rng_state", "current_stream", "default_stream", "Stream",
)  # fmt: skip


def device_function_cases() -> st.SearchStrategy[tuple[str, Any]]:
    return st.tuples(st.sampled_from(DEVICE_FUNCTIONS), device_arguments())


def _call_device_function(name: str, arg: Any) -> Any:
    fn = getattr(torch.neuron, name)
    if name == "device":
        with fn(arg):
            return torch.neuron.current_device()
    if name == "set_device":
        fn(arg)
        return torch.neuron.current_device()
    return fn(arg)


def _device_of_result(name: str, value: Any) -> int | None:
    """The device a successful call acted on, where its result says it."""
    if name in ("set_device", "device"):
        return value
    if name in ("current_stream", "default_stream", "Stream"):
        return value.device_index
    if name == "memory_summary":
        header = value.split(" ", 1)[0]  # "neuron:N"
        return int(header.split(":")[1]) if header.startswith("neuron:") else None
    return None


def check_device_function(case: tuple[str, Any]) -> None:
    name, arg = case
    want = expected_index(arg)
    before = torch.neuron.current_device()
    try:
        outcome = run(lambda: _call_device_function(name, arg))
    finally:
        torch.neuron.set_device(before)
    if want is INVALID:
        expect_error(outcome, f"{arg!r} names no neuron device of this process")
        return
    expect_ok(outcome, f"{arg!r} means neuron:{want}")
    acted_on = _device_of_result(name, outcome.value)
    if acted_on is not None and acted_on != want:
        raise Finding(f"{name}({arg!r}) acted on neuron:{acted_on}, expected neuron:{want}")
    if name == "mem_get_info":
        total = torch.neuron.get_device_properties(want).total_memory
        if outcome.value[1] != total:
            raise Finding(f"mem_get_info({arg!r}) total {outcome.value[1]} != {total}")
    if name in ("get_device_properties", "get_device_name"):
        ref = torch.neuron.get_device_properties(want)
        got = outcome.value if name == "get_device_name" else outcome.value.name
        if got != ref.name:
            raise Finding(f"{name}({arg!r}) = {got!r}, neuron:{want} is {ref.name!r}")
    if torch.neuron.current_device() != before:
        raise Finding(f"{name}({arg!r}) left neuron:{torch.neuron.current_device()} current")


# --- RNG state and seeds -------------------------------------------------------------------


def _state_arguments() -> st.SearchStrategy[Any]:
    def state_like(kind: str) -> Any:
        good = torch.neuron.get_rng_state(0)
        return {
            "good": good,
            "good-neuron": good.to("neuron"),
            "short": good[:-8],
            "long": torch.cat([good, good[:8]]),
            "float": good.float(),
            "int64": good.long(),
            "2d": good.view(-1, 8) if good.numel() % 8 == 0 else good.view(1, -1),
            "noncontig": torch.stack([good, good], 1)[:, 0],
            "empty": torch.empty(0, dtype=torch.uint8),
            "meta": torch.empty_like(good, device="meta"),
        }[kind]

    kinds = ["good", "good-neuron", "short", "long", "float", "int64", "2d", "noncontig", "empty",
             "meta"]  # fmt: skip
    return st.one_of(
        st.sampled_from(kinds).map(lambda k: ("tensor", k, state_like(k))),
        st.one_of(st.none(), st.integers(), st.text(max_size=4), st.binary(max_size=16)).map(
            lambda v: ("object", type(v).__name__, v)
        ),
    )


def rng_cases() -> st.SearchStrategy[tuple[str, Any, Any]]:
    seeds = st.one_of(
        st.integers(-(2**70), 2**70),
        st.sampled_from([0, -1, 2**63, 2**64 - 1, 2**64, -(2**63) - 1]),
        st.floats(allow_nan=True),
        st.none(),
        st.text(max_size=5),
        st.booleans(),
    )
    return st.one_of(
        st.tuples(st.just("set_rng_state"), _state_arguments(), device_arguments()),
        st.tuples(st.sampled_from(["manual_seed", "manual_seed_all"]), seeds, st.none()),
    )


def _cpu_seed_outcome(seed: Any) -> Outcome:
    """What torch.cuda.manual_seed's rule (int(seed), then the generator) does with seed."""

    def seed_cpu_generator() -> int:
        return torch.Generator().manual_seed(int(seed)).initial_seed()

    return run(seed_cpu_generator)


def check_rng(case: tuple[str, Any, Any]) -> None:
    name, value, device = case
    saved = [torch.neuron.get_rng_state(i) for i in range(torch.neuron.device_count())]
    try:
        if name == "set_rng_state":
            _check_set_rng_state(value, device)
        else:
            ref = _cpu_seed_outcome(value)
            got = run(lambda: getattr(torch.neuron, name)(value))
            if got.ok != ref.ok:
                raise Finding(f"{name}({value!r}): {got.describe()}; CPU rule: {ref.describe()}")
            if got.ok and torch.neuron.initial_seed() != ref.value:
                raise Finding(
                    f"{name}({value!r}): initial_seed {torch.neuron.initial_seed()} != {ref.value}"
                )
    finally:
        for i, state in enumerate(saved):
            torch.neuron.set_rng_state(state, i)


def _check_set_rng_state(value: tuple[str, str, Any], device: Any) -> None:
    kind, label, state = value
    index = expected_index(device)
    outcome = run(lambda: torch.neuron.set_rng_state(state, device))
    # The reference: the CPU generator's set_state (the neuron generator owns a CPU engine,
    # and set_rng_state, like torch.cuda's, passes a contiguous CPU copy of the state).
    good = (
        kind == "tensor"
        and run(
            lambda: torch.Generator().set_state(
                state.clone(memory_format=torch.contiguous_format).cpu()
            )
        ).ok
    )
    if index is INVALID or not good:
        expect_error(outcome, f"state {label} for device {device!r}")
        return
    expect_ok(outcome, f"a valid state for neuron:{index}")
    if not torch.equal(torch.neuron.get_rng_state(index), state.cpu().reshape(-1)):
        raise Finding(f"set_rng_state({label}) then get_rng_state differs")


# --- streams and events --------------------------------------------------------------------

STREAM_OPERATIONS = (
    "Stream", "Event", "record", "wait", "elapsed_time", "query", "synchronize",
    "stream-context", "set_stream", "wait_event", "wait_stream", "record_event",
)  # fmt: skip


def _stream_arguments() -> st.SearchStrategy[Any]:
    return st.one_of(
        device_arguments(),
        st.sampled_from(["stream0", "stream1", "stream-other", "event", "event-timed",
                         "cpu-stream"]),
        st.integers(-2, 3).map(lambda p: ("priority", p)),
    )  # fmt: skip


def stream_cases() -> st.SearchStrategy[tuple[str, Any]]:
    return st.tuples(st.sampled_from(STREAM_OPERATIONS), _stream_arguments())


def _materialise(arg: Any) -> Any:
    if arg == "stream0":
        return torch.neuron.Stream(0)
    if arg == "stream1":
        return torch.neuron.Stream(1)
    if arg == "stream-other":
        return torch.neuron.current_stream(0)
    if arg in ("event", "event-timed"):
        event = torch.neuron.Event(enable_timing=arg == "event-timed")
        event.record()
        return event
    if arg == "cpu-stream":
        return torch.Stream("cpu")
    return arg


def _stream_call(op: str, arg: Any) -> Any:
    if op == "Stream":
        if isinstance(arg, tuple):
            return torch.neuron.Stream(priority=arg[1])
        return torch.neuron.Stream(arg)
    if op == "Event":
        return torch.neuron.Event(enable_timing=arg)
    event = torch.neuron.Event(enable_timing=True)
    event.record()
    stream = torch.neuron.Stream(0)
    if op in ("record", "wait"):
        return getattr(event, op)(arg)
    if op == "elapsed_time":
        return event.elapsed_time(arg)
    if op in ("query", "synchronize"):
        return getattr(stream, op)()
    if op == "stream-context":
        with torch.neuron.stream(arg):
            return torch.neuron.current_stream()
    if op == "set_stream":
        return torch.neuron.set_stream(arg)
    return getattr(stream, op)(arg)


def _stream_argument_valid(op: str, arg: Any) -> bool | None:
    """Whether op must accept arg (True), must refuse it (False), or either (None)."""
    kind_of = {
        "record": (torch.Stream, type(None)), "wait": (torch.Stream, type(None)),
        "elapsed_time": (torch.Event,), "stream-context": (torch.Stream, type(None)),
        "set_stream": (torch.Stream,), "wait_event": (torch.Event,),
        "wait_stream": (torch.Stream,), "record_event": (torch.Event, type(None)),
    }  # fmt: skip
    if op in ("query", "synchronize"):
        return True
    if op == "Event":
        return isinstance(arg, bool)
    if op == "Stream":
        if isinstance(arg, tuple):
            return None  # priorities: PyTorch clamps them, either outcome is fine
        return expected_index(arg) is not INVALID
    if not isinstance(arg, kind_of[op]):
        return False
    if isinstance(arg, torch.Stream) and arg.device.type != "neuron":
        return False
    return None


def check_stream_operation(case: tuple[str, Any]) -> None:
    op, raw = case
    before = torch.neuron.current_stream()
    try:
        arg = _materialise(raw)
        valid = _stream_argument_valid(op, arg)
        outcome = run(lambda: _stream_call(op, arg))
    finally:
        torch.neuron.set_stream(before)
    if valid is False:
        expect_error(outcome, f"{op} with {raw!r}")
    elif valid is True:
        expect_ok(outcome, f"{op} with {raw!r} is valid")
    if op == "elapsed_time" and outcome.ok and not math.isfinite(outcome.value):
        raise Finding(f"elapsed_time returned {outcome.value}")
    if torch.neuron.current_stream() != before:
        raise Finding(f"{op}({raw!r}) left another stream current")


def device_api_targets() -> dict[str, tuple[st.SearchStrategy[Any], Callable[[Any], None]]]:
    return {
        "torch.neuron device functions": (device_function_cases(), check_device_function),
        "torch.neuron RNG state and seeds": (rng_cases(), check_rng),
        "torch.neuron streams and events": (stream_cases(), check_stream_operation),
    }


__all__ = ["check_message", "device_api_targets", "device_arguments", "expected_index"]
