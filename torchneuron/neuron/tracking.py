"""Which ops ran on the device, which went through a host fallback, and compile metrics."""

from __future__ import annotations

from typing import Any

from .. import _C


def get_executed_ops() -> dict[str, int]:
    """Op name -> number of times it ran on a neuron device since the last clear."""
    return dict(_C._executed_ops())


def get_fallback_ops() -> dict[str, int]:
    """Op name -> number of times its results went through separate host memory."""
    return dict(_C._fallback_ops())


def clear_op_tracking() -> None:
    _C._clear_op_tracking()


def get_dynamo_metrics() -> dict[str, Any]:
    """Dynamo's compile counters for this process: graphs compiled, frames, recompiles."""
    from torch._dynamo.utils import counters

    stats = counters["stats"]
    recompiles = dict(counters["recompiles"])
    return {
        "unique_graphs": int(stats.get("unique_graphs", 0)),
        "calls_captured": int(stats.get("calls_captured", 0)),
        "frames_ok": int(counters["frames"].get("ok", 0)),
        "frames_total": int(counters["frames"].get("total", 0)),
        "recompiles": sum(recompiles.values()),
        "recompile_reasons": recompiles,
    }


def reset_dynamo_metrics() -> None:
    from torch._dynamo.utils import counters

    counters.clear()
