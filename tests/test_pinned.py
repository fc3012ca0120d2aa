"""Pinned (page-locked) host memory and asynchronous copies through it."""

from __future__ import annotations

import torch

EXACT = {"rtol": 0, "atol": 0}


def test_pin_memory_is_pinned():
    x = torch.randn(1000)
    assert not x.is_pinned()
    pinned = x.pin_memory()
    assert pinned.is_pinned()
    assert pinned.device.type == "cpu"
    assert pinned.data_ptr() != x.data_ptr()
    torch.testing.assert_close(pinned, x, **EXACT)
    assert pinned.pin_memory() is pinned  # already pinned: no copy


def test_empty_with_pin_memory():
    x = torch.empty(257, dtype=torch.float16, pin_memory=True)
    assert x.is_pinned()
    y = torch.zeros(3, 4, pin_memory=True)
    assert y.is_pinned()
    assert y.sum().item() == 0.0


def test_views_of_pinned_are_pinned():
    pinned = torch.arange(100.0).pin_memory()
    assert pinned[10:20].is_pinned()
    assert pinned.view(10, 10).t().is_pinned()


def test_pinned_to_neuron_non_blocking():
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16, torch.int64):
        src = (torch.randn(128, 65) * 100).to(dtype).pin_memory()
        dev = src.to("neuron", non_blocking=True)
        other = src.to("neuron:1", non_blocking=True)
        torch.neuron.synchronize()
        torch.neuron.synchronize(1)
        assert dev.device == torch.device("neuron:0")
        torch.testing.assert_close(dev.cpu(), src, **EXACT)
        torch.testing.assert_close(other.cpu(), src, **EXACT)


def test_neuron_to_pinned_non_blocking():
    torch.manual_seed(0)
    dev = torch.randn(300, device="neuron")
    host = torch.empty(300, pin_memory=True)
    host.copy_(dev, non_blocking=True)
    torch.neuron.synchronize()
    torch.testing.assert_close(host, dev.cpu(), **EXACT)
    back = dev.to("cpu", non_blocking=True)
    torch.neuron.current_stream().synchronize()
    torch.testing.assert_close(back, dev.cpu(), **EXACT)


def test_non_blocking_copy_on_side_stream():
    src = torch.arange(4096.0).pin_memory()
    side = torch.neuron.Stream()
    with torch.neuron.stream(side):
        dev = src.to("neuron", non_blocking=True)
        doubled = dev * 2
    side.synchronize()
    torch.testing.assert_close(doubled.cpu(), torch.arange(4096.0) * 2, **EXACT)


def test_pinned_source_reuse_after_sync():
    # Reusing a pinned staging buffer after synchronising must not change earlier copies.
    staging = torch.empty(64, pin_memory=True)
    copies = []
    for i in range(4):
        staging.fill_(float(i))
        copies.append(staging.to("neuron", non_blocking=True))
        torch.neuron.synchronize()
    assert [c.sum().item() for c in copies] == [0.0, 64.0, 128.0, 192.0]


def test_dataloader_pin_memory():
    dataset = torch.utils.data.TensorDataset(torch.arange(20.0).view(10, 2), torch.arange(10))
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, pin_memory=True)
    seen = []
    for features, labels in loader:
        assert features.is_pinned() and labels.is_pinned()
        features = features.to("neuron", non_blocking=True)
        seen.append((features * 1).cpu())
    torch.testing.assert_close(torch.cat(seen), torch.arange(20.0).view(10, 2), **EXACT)


def test_empty_host_cache_keeps_live_pinned_tensors():
    keep = torch.arange(512.0).pin_memory()
    freed = [torch.empty(4096, pin_memory=True) for _ in range(4)]
    del freed
    torch.accelerator.empty_host_cache()
    assert keep.is_pinned()
    torch.testing.assert_close(keep.to("neuron").cpu(), torch.arange(512.0), **EXACT)
    again = torch.empty(4096, pin_memory=True)
    assert again.is_pinned()
