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


def get_synchronizing_ops() -> dict[str, int]:
    """Op name -> number of times it waited for launched work since the last clear.

    Such an op ran on the calling thread after the device's queued work had finished (it
    reads device data on the host, as ``.item()`` and ``.cpu()`` do, or it cannot run
    asynchronously), so Python stopped running ahead of the device there. Few of them in a
    loop means launches overlap with compute; many point at what to avoid or report.
    """
    return dict(_C._synchronizing_ops())


def clear_op_tracking() -> None:
    _C._clear_op_tracking()


def get_dynamo_metrics() -> dict[str, Any]:
    """Compile counters for this process.

    From Dynamo: graphs captured, frames, its recompile counters. From the neuron backend:
    ``compiles`` (graphs Dynamo handed to it), ``recompiles`` and ``recompile_reasons`` (later
    graphs of an already compiled frame, with the inputs whose shape changed), and
    ``host_graphs`` (forward, backward and inference graphs lowered to host code); from the
    compiled-graph cache (TORCH_NEURONX_NEFF_CACHE_DIR): ``cache_hits``, ``cache_misses``,
    ``cache_corrupted`` (entries found damaged, removed and compiled again).
    """
    from torch._dynamo.utils import counters

    from ..compile.backend import cache_counters, metrics

    cache = cache_counters()
    stats = counters["stats"]
    recompiles = dict(counters["recompiles"])
    with metrics.lock:
        backend = {
            "compiles": metrics.compiles,
            "recompiles": metrics.recompiles,
            "recompile_reasons": list(metrics.recompile_reasons),
            "host_graphs": metrics.host_graphs,
            "cache_hits": cache["hits"],
            "cache_misses": cache["misses"],
            "cache_corrupted": cache["corrupted"],
        }
    return {
        "unique_graphs": int(stats.get("unique_graphs", 0)),
        "calls_captured": int(stats.get("calls_captured", 0)),
        "frames_ok": int(counters["frames"].get("ok", 0)),
        "frames_total": int(counters["frames"].get("total", 0)),
        "dynamo_recompiles": sum(recompiles.values()),
        "dynamo_recompile_reasons": recompiles,
        **backend,
    }


def reset_dynamo_metrics() -> None:
    """Clears Dynamo's counters and the neuron backend's."""
    from torch._dynamo.utils import counters

    from ..compile.backend import cache_counters, metrics

    counters.clear()
    with metrics.lock:
        metrics.reset()
    cache_counters(reset=True)
