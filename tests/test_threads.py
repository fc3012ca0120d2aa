"""Host-to-device copies and ops from several threads at once, each with its own current
device; Transformers' asynchronous weight loading; pinned memory and non_blocking copies.

Every result is compared exactly (``rtol=0, atol=0``) with the same computation on the CPU
in the same thread: the device runs the CPU's kernels, and the matmul inputs are small
integers held in float32, so no rounding depends on summation order.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from conftest import tiny_llama_config

EXACT = {"rtol": 0, "atol": 0}
# softmax runs our own kernel on neuron (native_row_ops.cpp): other float32 rounding than
# the CPU's, a few ulps; a race between threads would show as far larger errors.
FLOAT32_ULPS = {"rtol": 1e-5, "atol": 1e-6}
THREADS = 4
ITERATIONS = 25


def run_threads(target, count=THREADS):
    """Runs target(i) in `count` threads started together; re-raises the first failure."""
    barrier = threading.Barrier(count)
    errors: list[BaseException] = []

    def body(i):
        try:
            barrier.wait()
            target(i)
        except BaseException as error:  # noqa: BLE001 - reported to the main thread
            errors.append(error)

    threads = [threading.Thread(target=body, args=(i,), name=f"worker-{i}") for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
        assert not thread.is_alive(), f"{thread.name} hung"
    if errors:
        raise errors[0]


def compute(a, b, idx):
    """A mix of ops: matmul, elementwise, reductions, softmax, indexing, casts, scans."""
    y = torch.relu(a @ b + 1.5) - a.sum(dim=1, keepdim=True)
    return {
        "matmul": y,
        "softmax": torch.softmax(y / 64, dim=-1),
        "gather": torch.index_select(y, 0, idx),
        "cumsum": torch.cumsum(idx * 3, dim=0),
        "max": y.max(dim=0).values,
        "half": y.to(torch.bfloat16).float().mean(dim=0),
    }


def test_threads_with_own_current_device_copies_and_ops():
    count = torch.neuron.device_count()
    assert count >= 2
    seen_devices: dict[int, set[int]] = {}

    def work(i):
        device = i % count
        torch.neuron.set_device(device)
        generator = torch.Generator().manual_seed(100 + i)
        devices = seen_devices.setdefault(i, set())
        for step in range(ITERATIONS):
            n = 16 + 8 * ((i + step) % 5)
            a = torch.randint(-8, 8, (n, 48), generator=generator).float()
            b = torch.randint(-8, 8, (48, n), generator=generator).float()
            idx = torch.randint(0, n, (n // 2,), generator=generator)
            # host -> device copies onto the thread's current device
            na, nb, nidx = a.to("neuron"), b.to("neuron"), idx.to("neuron")
            assert na.device == torch.device("neuron", device), na.device
            assert torch.neuron.current_device() == device
            expected = compute(a, b, idx)
            actual = compute(na, nb, nidx)
            for key, value in expected.items():
                assert actual[key].device == torch.device("neuron", device)
                tolerance = FLOAT32_ULPS if key == "softmax" else EXACT
                torch.testing.assert_close(actual[key].cpu(), value, **tolerance, msg=key)
                devices.add(actual[key].device.index)
            # device -> device (to the next device) and back
            other = (device + 1) % count
            moved = actual["matmul"].to(f"neuron:{other}")
            assert moved.device.index == other
            torch.testing.assert_close(moved.cpu(), expected["matmul"], **EXACT)
            # in-place on the device while the other threads run
            na.mul_(2).add_(nb[:, :1].t())
            torch.testing.assert_close(na.cpu(), a.mul(2).add(b[:, :1].t()), **EXACT)
        assert torch.neuron.current_device() == device

    run_threads(work)
    assert {i: sorted(d) for i, d in seen_devices.items()} == {
        i: [i % count] for i in range(THREADS)
    }
    # The current device is per thread: the main thread's did not change.
    assert torch.neuron.current_device() == 0


def materialize(tensor, device):
    """What Transformers' loader threads do with each weight."""
    return tensor[...].to(device)


def test_thread_pool_to_device_like_transformers():
    """A pool of threads doing tensor.to(device) for many tensors (Transformers' loader)."""
    generator = torch.Generator().manual_seed(7)
    tensors = {
        f"w{i}": torch.randn(17 + i, 33, generator=generator).to(
            (torch.float32, torch.bfloat16, torch.float16, torch.int64)[i % 4]
        )
        for i in range(64)
    }
    for target in ("neuron", "neuron:2"):
        with ThreadPoolExecutor(max_workers=THREADS) as pool:
            futures = {k: pool.submit(materialize, t, target) for k, t in tensors.items()}
            loaded = {k: f.result() for k, f in futures.items()}
        expected_device = torch.device("neuron", 0 if target == "neuron" else 2)
        for key, value in tensors.items():
            assert loaded[key].device == expected_device
            torch.testing.assert_close(loaded[key].cpu(), value, **EXACT)


@pytest.mark.parametrize("device_map", ["neuron", {"": "neuron:1"}])
def test_transformers_async_weight_loading(tmp_path, monkeypatch, device_map):
    """from_pretrained(..., device_map='neuron') with the loader's thread pool (no
    HF_DEACTIVATE_ASYNC_LOAD): every weight arrives on the device, equal to the CPU model."""
    import transformers.core_model_loading as loading
    from transformers import LlamaForCausalLM

    monkeypatch.delenv("HF_DEACTIVATE_ASYNC_LOAD", raising=False)
    assert "HF_DEACTIVATE_ASYNC_LOAD" not in os.environ

    torch.manual_seed(0)
    reference = LlamaForCausalLM(
        tiny_llama_config(
            vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4
        )
    ).eval()
    reference.save_pretrained(tmp_path)

    # Record which threads the loader's copies run on, to be sure the async path was taken.
    copy_threads: set[str] = set()
    materialize = loading._materialize_copy

    def spy(tensor, device=None, dtype=None):
        copy_threads.add(threading.current_thread().name)
        return materialize(tensor, device, dtype)

    monkeypatch.setattr(loading, "_materialize_copy", spy)
    model = LlamaForCausalLM.from_pretrained(tmp_path, device_map=device_map)
    assert copy_threads and threading.main_thread().name not in copy_threads, copy_threads

    index = 0 if device_map == "neuron" else 1
    expected = reference.state_dict()
    actual = model.state_dict()
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        assert actual[key].device == torch.device("neuron", index), key
        assert actual[key].dtype == value.dtype, key
        torch.testing.assert_close(actual[key].cpu(), value, **EXACT, msg=key)

    # The loaded model computes what the CPU model computes.
    ids = torch.randint(0, 128, (1, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = reference(ids).logits
        got = model(ids.to(f"neuron:{index}")).logits
    torch.testing.assert_close(got.cpu(), want)


def test_pinned_non_blocking_copies_from_threads():
    """Each thread: pinned host -> its device (non_blocking), an op, device -> pinned host
    (non_blocking), synchronise, compare; the host buffers are reused across iterations."""
    count = torch.neuron.device_count()

    def work(i):
        device = i % count
        torch.neuron.set_device(device)
        generator = torch.Generator().manual_seed(200 + i)
        src = torch.empty(4096, pin_memory=True)
        dst = torch.empty(4096, pin_memory=True)
        stream = torch.neuron.Stream()
        for _ in range(ITERATIONS):
            src.copy_(torch.randn(4096, generator=generator))
            expected = src * 3 - 1
            with torch.neuron.stream(stream):
                dev = src.to("neuron", non_blocking=True)
                out = dev * 3 - 1
                dst.copy_(out, non_blocking=True)
                event = torch.neuron.Event()
                event.record(stream)
            event.synchronize()
            assert dev.device == torch.device("neuron", device)
            torch.testing.assert_close(dst, expected, **EXACT)
            back = out.to("cpu", non_blocking=True)
            torch.neuron.synchronize(device)
            assert back.is_pinned()  # as on CUDA: a non_blocking copy to the host is pinned
            torch.testing.assert_close(back, expected, **EXACT)

    run_threads(work)


def test_pin_memory_and_non_blocking_basics():
    x = torch.randn(1000)
    pinned = x.pin_memory()
    assert pinned.is_pinned() and not x.is_pinned()
    dev = pinned.to("neuron", non_blocking=True)
    torch.neuron.synchronize()
    torch.testing.assert_close(dev.cpu(), x, **EXACT)
    # Non-pinned sources with non_blocking=True are still correct (the copy is synchronous).
    dev2 = x.to("neuron:1", non_blocking=True)
    torch.neuron.synchronize(1)
    torch.testing.assert_close(dev2.cpu(), x, **EXACT)
