"""The caching allocator: statistics, peaks, caching and release, stream-aware reuse."""

from __future__ import annotations

import gc

import pytest
import torch

MiB = 1 << 20
BLOCK = 512  # every allocation is rounded up to a multiple of 512 bytes


def rounded(nbytes: int) -> int:
    return max(BLOCK, -(-nbytes // BLOCK) * BLOCK)


@pytest.fixture(autouse=True)
def _collect():
    gc.collect()
    yield
    gc.collect()


@pytest.mark.parametrize(
    ("numel", "dtype"),
    [
        (1, torch.float32),
        (128, torch.float32),
        (129, torch.float32),
        (1000, torch.float32),
        (3, torch.int8),
        (1025, torch.bfloat16),
        (250_000, torch.float32),
        (3 * MiB, torch.uint8),
    ],
)
def test_memory_allocated_grows_by_rounded_size(numel, dtype):
    for device in (0, 1):
        before = torch.neuron.memory_allocated(device)
        x = torch.empty(numel, dtype=dtype, device=f"neuron:{device}")
        nbytes = numel * x.element_size()
        assert torch.neuron.memory_allocated(device) - before == rounded(nbytes)
        assert torch.neuron.memory_stats(device)["requested_bytes.all.current"] >= nbytes
        del x
        assert torch.neuron.memory_allocated(device) == before


def test_zero_size_tensor_allocates_nothing():
    before = torch.neuron.memory_allocated()
    x = torch.empty(0, 5, device="neuron")
    assert torch.neuron.memory_allocated() == before
    assert x.shape == (0, 5)


def test_memory_per_device_is_independent():
    before = [torch.neuron.memory_allocated(i) for i in range(4)]
    x = torch.empty(4096, device="neuron:3")
    after = [torch.neuron.memory_allocated(i) for i in range(4)]
    assert after[3] - before[3] == 4096 * 4
    assert after[:3] == before[:3]
    assert torch.neuron.memory_allocated(torch.device("neuron:3")) == after[3]
    assert torch.neuron.memory_allocated("neuron:3") == after[3]
    with torch.neuron.device(3):
        assert torch.neuron.memory_allocated() == after[3]
    del x


def test_op_results_are_counted():
    a = torch.ones(256, 256, device="neuron")
    before = torch.neuron.memory_allocated()
    b = a @ a
    c = a + 1
    assert torch.neuron.memory_allocated() - before == 2 * 256 * 256 * 4
    del b, c
    assert torch.neuron.memory_allocated() == before


def test_max_memory_allocated_and_reset_peak():
    torch.neuron.reset_peak_memory_stats()
    base = torch.neuron.memory_allocated()
    assert torch.neuron.max_memory_allocated() == base
    x = torch.empty(2 * MiB, dtype=torch.uint8, device="neuron")
    y = torch.empty(MiB, dtype=torch.uint8, device="neuron")
    del x, y
    assert torch.neuron.memory_allocated() == base
    assert torch.neuron.max_memory_allocated() == base + 3 * MiB
    torch.neuron.reset_peak_memory_stats()
    assert torch.neuron.max_memory_allocated() == base
    assert torch.neuron.max_memory_reserved() == torch.neuron.memory_reserved()


def test_reset_max_memory_allocated_alias():
    x = torch.empty(MiB, dtype=torch.uint8, device="neuron")
    del x
    torch.neuron.reset_max_memory_allocated()
    assert torch.neuron.max_memory_allocated() == torch.neuron.memory_allocated()


def test_reserved_at_least_allocated_and_cached_after_free():
    x = torch.empty(12 * MiB, dtype=torch.uint8, device="neuron")
    assert torch.neuron.memory_reserved() >= torch.neuron.memory_allocated()
    reserved = torch.neuron.memory_reserved()
    assert reserved >= 12 * MiB
    del x
    # Freed memory stays cached (reserved) until empty_cache.
    assert torch.neuron.memory_reserved() == reserved
    assert torch.neuron.max_memory_reserved() >= reserved


def test_freed_block_is_reused():
    x = torch.empty(12 * MiB, dtype=torch.uint8, device="neuron")
    ptr = x.data_ptr()
    reserved = torch.neuron.memory_reserved()
    del x
    y = torch.empty(12 * MiB, dtype=torch.uint8, device="neuron")
    assert y.data_ptr() == ptr
    assert torch.neuron.memory_reserved() == reserved


def test_empty_cache_releases_reserved_memory():
    torch.neuron.empty_cache()
    reserved_before = torch.neuron.memory_reserved()
    free_before, total = torch.neuron.mem_get_info()
    x = torch.empty(30 * MiB, dtype=torch.uint8, device="neuron")
    reserved_with = torch.neuron.memory_reserved()
    assert reserved_with - reserved_before >= 30 * MiB
    free_with, _ = torch.neuron.mem_get_info()
    assert free_before - free_with >= 30 * MiB
    del x
    assert torch.neuron.memory_reserved() == reserved_with  # cached
    torch.neuron.empty_cache()
    assert torch.neuron.memory_reserved() <= reserved_before
    assert torch.neuron.mem_get_info()[0] >= free_before
    assert torch.neuron.mem_get_info()[1] == total


def test_empty_cache_keeps_live_tensors_intact():
    x = torch.arange(100_000.0, device="neuron")
    junk = [torch.empty(MiB, device="neuron") for _ in range(5)]
    del junk
    torch.neuron.empty_cache()
    torch.testing.assert_close(x.cpu(), torch.arange(100_000.0), rtol=0, atol=0)
    assert torch.neuron.memory_reserved() >= torch.neuron.memory_allocated() > 0


def test_accelerator_empty_cache():
    x = torch.empty(30 * MiB, dtype=torch.uint8, device="neuron")
    del x
    reserved = torch.neuron.memory_reserved()
    torch.accelerator.empty_cache()
    assert torch.neuron.memory_reserved() <= reserved - 30 * MiB


def test_memory_stats_keys_like_cuda():
    x = torch.empty(1000, device="neuron")
    stats = torch.neuron.memory_stats()
    for key in [
        "allocated_bytes.all.current",
        "allocated_bytes.all.peak",
        "allocated_bytes.all.allocated",
        "allocated_bytes.all.freed",
        "allocated_bytes.small_pool.current",
        "allocated_bytes.large_pool.current",
        "reserved_bytes.all.current",
        "reserved_bytes.all.peak",
        "active_bytes.all.current",
        "requested_bytes.all.current",
        "allocation.all.current",
        "segment.all.current",
        "inactive_split_bytes.all.current",
        "num_alloc_retries",
        "num_ooms",
        "num_device_alloc",
        "num_device_free",
    ]:
        assert key in stats, key
        assert isinstance(stats[key], int), key
    assert stats["allocated_bytes.all.current"] == torch.neuron.memory_allocated()
    assert stats["reserved_bytes.all.current"] == torch.neuron.memory_reserved()
    assert stats["allocation.all.current"] >= 1
    assert stats["allocated_bytes.all.current"] == (
        stats["allocated_bytes.small_pool.current"] + stats["allocated_bytes.large_pool.current"]
    )
    assert (
        stats["allocated_bytes.all.allocated"] - stats["allocated_bytes.all.freed"]
        == (stats["allocated_bytes.all.current"])
    )
    assert list(stats) == sorted(stats)  # an OrderedDict sorted by key, as torch.cuda's
    del x


def test_accumulated_stats_count_and_reset():
    torch.neuron.reset_accumulated_memory_stats()
    stats = torch.neuron.memory_stats()
    assert stats["allocated_bytes.all.allocated"] == 0
    assert stats["allocation.all.allocated"] == 0
    tensors = [torch.empty(1000, device="neuron") for _ in range(3)]
    stats = torch.neuron.memory_stats()
    assert stats["allocation.all.allocated"] == 3
    assert stats["allocated_bytes.all.allocated"] == 3 * rounded(4000)
    del tensors
    stats = torch.neuron.memory_stats()
    assert stats["allocation.all.freed"] == 3
    assert stats["allocated_bytes.all.freed"] == 3 * rounded(4000)


def test_memory_summary_mentions_device():
    x = torch.empty(1000, device="neuron:1")
    summary = torch.neuron.memory_summary(1)
    assert isinstance(summary, str)
    assert "neuron:1" in summary
    assert "Allocated" in summary or "allocated" in summary
    assert "neuron:0" in torch.neuron.memory_summary()
    assert "neuron:0" in torch.neuron.memory_summary(abbreviated=True)
    del x


def test_mem_get_info_free_and_total():
    free, total = torch.neuron.mem_get_info()
    assert total == torch.neuron.get_device_properties(0).total_memory
    assert 0 <= free <= total
    assert total - free >= torch.neuron.memory_reserved()
    assert torch.neuron.mem_get_info(1)[1] == torch.neuron.get_device_properties(1).total_memory
    assert torch.accelerator.get_memory_info(0)[1] == total


def test_accelerator_memory_agrees_with_neuron():
    x = torch.empty(5000, device="neuron:2")
    for index in (0, 2):
        assert torch.accelerator.memory_allocated(index) == torch.neuron.memory_allocated(index)
        assert torch.accelerator.memory_reserved(index) == torch.neuron.memory_reserved(index)
        assert torch.accelerator.max_memory_allocated(index) == (
            torch.neuron.max_memory_allocated(index)
        )
        assert torch.accelerator.max_memory_reserved(index) == (
            torch.neuron.max_memory_reserved(index)
        )
    torch.accelerator.reset_peak_memory_stats(2)
    assert torch.neuron.max_memory_allocated(2) == torch.neuron.memory_allocated(2)
    del x


def test_small_block_churn_is_invisible_in_stats_and_empty_cache():
    # Freed blocks of up to 4 KiB wait unmerged in a per-size stash for the next op of their
    # size; memory stats and empty_cache must see them as returned to the pool.
    torch.neuron.empty_cache()
    keys = (
        "allocated_bytes.all.current",
        "active_bytes.all.current",
        "active.all.current",
        "inactive_split.all.current",
        "inactive_split_bytes.all.current",
    )
    before = torch.neuron.memory_stats()
    reserved = torch.neuron.memory_reserved()
    x, expected = torch.ones(4, 4, device="neuron"), torch.ones(4, 4)
    for numel in (8, 16, 128, 1000, 16, 8):
        x = x.sum() + torch.ones(numel, device="neuron")  # results freed one op later
        expected = expected.sum() + torch.ones(numel)
    assert torch.equal(x.cpu(), expected)  # same host kernels: bitwise
    del x
    after = torch.neuron.memory_stats()
    assert {k: after[k] for k in keys} == {k: before[k] for k in keys}
    torch.neuron.empty_cache()
    assert torch.neuron.memory_reserved() == reserved


# ---------------------------------------------------------------------------- streams


def test_blocks_are_not_shared_across_streams():
    side = torch.neuron.Stream()
    with torch.neuron.stream(side):
        a = torch.empty(1024, device="neuron")
    ptr = a.data_ptr()
    del a
    b = torch.empty(1024, device="neuron")  # default stream: must not take side's block
    assert b.data_ptr() != ptr
    with torch.neuron.stream(side):
        c = torch.empty(1024, device="neuron")
    assert c.data_ptr() == ptr  # the side stream's own cached block


def test_record_stream_keeps_data_valid():
    side = torch.neuron.Stream()
    x = torch.arange(4096.0, device="neuron")
    before = torch.neuron.memory_allocated()
    side.wait_stream(torch.neuron.current_stream())
    with torch.neuron.stream(side):
        y = x * 2
    x.record_stream(side)
    del x
    assert torch.neuron.memory_allocated() == before  # y (same size) replaced x
    # New work on the default stream must not corrupt what the side stream produced.
    torch.neuron.current_stream().wait_stream(side)
    z = torch.full((4096,), -1.0, device="neuron")
    side.synchronize()
    torch.testing.assert_close(y.cpu(), torch.arange(4096.0) * 2, rtol=0, atol=0)
    assert z.sum().item() == -4096.0


def test_record_stream_block_reused_after_stream_work():
    side = torch.neuron.Stream()
    x = torch.empty(2048, device="neuron")
    ptr = x.data_ptr()
    with torch.neuron.stream(side):
        x.fill_(3.0)
    x.record_stream(side)
    del x
    side.synchronize()
    torch.neuron.synchronize()
    # Once the side stream is done, the block returns to the default stream's pool.
    reused = [torch.empty(2048, device="neuron") for _ in range(4)]
    assert ptr in [t.data_ptr() for t in reused]
