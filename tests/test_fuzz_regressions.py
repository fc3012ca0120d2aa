"""Defects the fuzzer (devtools.fuzz) found, each pinned by the case that found it.

Before the fixes: a device index was narrowed to 8 bits before it was checked, so
memory_stats(1000) silently reported neuron:0 (1000 wraps to -24, and a negative index
meant the current device), default_stream(1000) returned a stream of device -24, and
set_device(1000) complained about "neuron:-24"; get_device_capability accepted any index;
set_rng_state, torch.neuron.stream and Event/Stream methods raised AttributeError or read an
int as a device type for arguments of the wrong type.
"""

from __future__ import annotations

import pytest
import torch

COUNT_MESSAGE = r"is not a valid device: this process sees 4 neuron device\(s\)"


@pytest.mark.parametrize(
    "fn",
    [
        "memory_stats", "memory_allocated", "memory_reserved", "max_memory_allocated",
        "reset_peak_memory_stats", "mem_get_info", "get_rng_state", "synchronize",
        "current_stream", "default_stream", "get_device_capability", "get_device_properties",
        "set_device", "Stream", "device",
    ],
)  # fmt: skip
@pytest.mark.parametrize("index", [4, 255, 256, 1000, 2**31, -2, -(2**63), 2**64])
def test_out_of_range_index_is_refused_with_its_value(fn, index):
    def call() -> None:
        if fn == "device":
            with torch.neuron.device(index):
                pass
        else:
            getattr(torch.neuron, fn)(index)

    with pytest.raises(IndexError, match=f"neuron:{index} {COUNT_MESSAGE}"):
        call()
    assert torch.neuron.current_device() == 0


def test_valid_index_acts_on_that_device():
    assert torch.neuron.default_stream(3).device_index == 3
    assert torch.neuron.current_stream(2).device_index == 2
    with torch.neuron.device(-1):  # -1: the current device, as torch.cuda
        assert torch.neuron.current_device() == 0
    assert torch.neuron.mem_get_info(-1)[1] == torch.neuron.get_device_properties(0).total_memory


@pytest.mark.parametrize("value", [True, False, 1.0, "1", b"0"])
def test_device_argument_of_wrong_type(value):
    with pytest.raises((TypeError, RuntimeError, ValueError)):
        torch.neuron.memory_allocated(value)
    with pytest.raises((TypeError, RuntimeError, ValueError)):
        torch.neuron.set_device(value)


@pytest.mark.parametrize("state", [None, 3, "state", [0, 1]])
def test_set_rng_state_of_wrong_type(state):
    with pytest.raises(TypeError, match="set_rng_state expects a torch.ByteTensor"):
        torch.neuron.set_rng_state(state)


@pytest.mark.parametrize("value", [1, "neuron", torch.device("neuron")])
def test_stream_context_and_event_methods_check_their_arguments(value):
    with pytest.raises(TypeError, match=r"torch.neuron.stream expects a torch.neuron.Stream"):
        torch.neuron.stream(value)
    event = torch.neuron.Event(enable_timing=True)
    for method in ("record", "wait"):
        with pytest.raises(TypeError, match=rf"Event.{method} expects a torch.neuron.Stream"):
            getattr(event, method)(value)
    with pytest.raises(TypeError, match="elapsed_time expects a torch.neuron.Event"):
        event.elapsed_time(value)
    stream = torch.neuron.Stream()
    with pytest.raises(TypeError, match="Stream.wait_event expects a torch.neuron.Event"):
        stream.wait_event(value)
    with pytest.raises(TypeError, match="Stream.wait_stream expects a torch.neuron.Stream"):
        stream.wait_stream(value)


def test_cpu_stream_is_refused_by_neuron_stream_functions():
    cpu = torch.Stream("cpu")
    with pytest.raises(ValueError, match="expects a neuron stream"):
        torch.neuron.stream(cpu)
    with pytest.raises(ValueError, match="expects a neuron stream"):
        torch.neuron.Event().record(cpu)
    with pytest.raises(TypeError, match="set_stream expects a torch.neuron.Stream, got None"):
        torch.neuron.set_stream(None)
    assert torch.neuron.current_stream().device_index == 0


def test_wait_event_none_was_silently_ignored():
    with pytest.raises(TypeError):
        torch.neuron.Stream().wait_event(None)
    event = torch.neuron.Event()
    event.record()
    torch.neuron.Stream().wait_event(event)  # a real event is still waited for


@pytest.mark.parametrize("raw", ["nan", "NaN", "-nan"])
def test_lock_timeout_nan_is_refused(raw, monkeypatch):
    """A NaN timeout made a wait for a live lock endless (monotonic() >= NaN is never true)."""
    from torchneuron.compile import neff_cache

    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT", raw)
    with pytest.raises(ValueError, match="TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT=.* must be >= 0"):
        neff_cache.lock_timeout()
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_LOCK_TIMEOUT", "inf")  # wait forever: valid
    assert neff_cache.lock_timeout() == float("inf")


def _average_against_sum(rank: int, size: int) -> str:
    import torch.distributed as dist

    t = torch.full((3,), float(rank + 1), device="neuron")
    op = dist.ReduceOp.AVG if rank == 0 else dist.ReduceOp.SUM
    try:
        dist.all_reduce(t, op=op)
    except RuntimeError as error:
        assert "do not match" in str(error) and "then averaged" in str(error), str(error)
    else:
        raise AssertionError(f"AVG on rank 0 and SUM on rank 1 gave {t.cpu().tolist()}")
    full = torch.ones(2 * 3, device="neuron")
    out = torch.empty(3, device="neuron")
    try:
        dist.reduce_scatter_tensor(out, full, op=op)
    except RuntimeError as error:
        assert "do not match" in str(error), str(error)
    else:
        raise AssertionError("reduce_scatter_tensor with AVG against SUM returned")
    t = torch.ones(3, device="neuron")
    dist.all_reduce(t, op=dist.ReduceOp.AVG)  # the group still works, and AVG on both is fine
    assert t.cpu().tolist() == [1.0] * 3
    return "ok"


def test_average_against_sum_is_a_mismatch():
    """AVG is a SUM then a division, and the shared-memory path compared only the SUM: a rank
    averaging while its peer summed got 1.5 and 3.0 silently (found by the collectives fuzz)."""
    from support.ranks import run_ranks

    assert run_ranks(_average_against_sum, 2) == {0: "ok", 1: "ok"}
