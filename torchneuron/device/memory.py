"""Memory management for torch.neuron: the caching allocator's statistics and controls."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

from .. import _C
from ._device import DeviceLike, _get_device_index
from ._lazy import _lazy_init, is_initialized


def _index(device: DeviceLike) -> int:
    _lazy_init()
    return _get_device_index(device)


def empty_cache() -> None:
    """Returns cached, unused device memory to the runtime."""
    if is_initialized():
        _C._empty_cache()


def memory_stats(device: DeviceLike = None) -> OrderedDict[str, Any]:
    """The caching allocator's statistics, with the same keys as torch.cuda.memory_stats."""
    return torch.accelerator.memory_stats(_index(device))


def memory_allocated(device: DeviceLike = None) -> int:
    return memory_stats(device).get("allocated_bytes.all.current", 0)


def max_memory_allocated(device: DeviceLike = None) -> int:
    return memory_stats(device).get("allocated_bytes.all.peak", 0)


def memory_reserved(device: DeviceLike = None) -> int:
    return memory_stats(device).get("reserved_bytes.all.current", 0)


def max_memory_reserved(device: DeviceLike = None) -> int:
    return memory_stats(device).get("reserved_bytes.all.peak", 0)


def reset_peak_memory_stats(device: DeviceLike = None) -> None:
    torch.accelerator.reset_peak_memory_stats(_index(device))


def reset_accumulated_memory_stats(device: DeviceLike = None) -> None:
    torch.accelerator.reset_accumulated_memory_stats(_index(device))


def reset_max_memory_allocated(device: DeviceLike = None) -> None:
    reset_peak_memory_stats(device)


def mem_get_info(device: DeviceLike = None) -> tuple[int, int]:
    """(free, total) bytes of the device: its capacity minus what the runtime has handed out."""
    free, total = _C._mem_get_info(_index(device))
    return int(free), int(total)


def _format_size(nbytes: int) -> str:
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} GiB"


def memory_summary(device: DeviceLike = None, abbreviated: bool = False) -> str:
    """A human-readable table of the allocator's statistics for a device."""
    index = _index(device)
    stats = memory_stats(index)
    free, total = mem_get_info(index)
    rows = [
        ("Allocated memory", "allocated_bytes", True),
        ("Active memory", "active_bytes", True),
        ("Requested memory", "requested_bytes", True),
        ("Reserved memory", "reserved_bytes", True),
        ("Non-releasable memory", "inactive_split_bytes", True),
        ("Allocations", "allocation", False),
        ("Active allocs", "active", False),
        ("Reserved segments", "segment", False),
        ("Non-releasable allocs", "inactive_split", False),
    ]
    header = f"{'Metric':<24}{'Cur Usage':>14}{'Peak Usage':>14}{'Tot Alloc':>14}{'Tot Freed':>14}"
    lines = [
        f"neuron:{index} memory summary ({get_name(index)}); capacity {_format_size(total)}, "
        f"free {_format_size(free)}",
        "=" * len(header),
        header,
        "-" * len(header),
    ]
    pools = ("all",) if abbreviated else ("all", "large_pool", "small_pool")
    for label, key, is_bytes in rows:
        for pool in pools:
            fmt = _format_size if is_bytes else str
            values = [
                stats.get(f"{key}.{pool}.{m}", 0) for m in ("current", "peak", "allocated", "freed")
            ]
            name = label if pool == "all" else f"  from {pool}"
            lines.append(f"{name:<24}" + "".join(f"{fmt(v):>14}" for v in values))
    lines.append("-" * len(header))
    for label, key in (
        ("Oversize allocations", "oversize_allocations"),
        ("Oversize segments", "oversize_segments"),
    ):
        values = [stats.get(f"{key}.{m}", 0) for m in ("current", "peak", "allocated", "freed")]
        lines.append(f"{label:<24}" + "".join(f"{v:>14}" for v in values))
    lines.append("-" * len(header))
    lines.append(
        f"OOMs: {stats.get('num_ooms', 0)}   alloc retries: {stats.get('num_alloc_retries', 0)}   "
        f"device allocs: {stats.get('num_device_alloc', 0)}   "
        f"device frees: {stats.get('num_device_free', 0)}"
    )
    return "\n".join(lines)


def get_name(index: int) -> str:
    return _C._get_device_properties(index)["name"]
