"""``nki.benchmark``: on Trainium it runs a kernel on a NeuronDevice and reports its latency;
here it runs the kernel once (results as ``nki.jit`` gives them) and reports the kernel's
cost estimate on the target chip (nki.estimate, docs/nki.md) as the latency, the same value at
every percentile: a model of the chip, not a measurement of it.

AWS's samples decorate kernels at import time (``benchmark(warmup=5, iters=10)(kernel)``) and
read ``.benchmark_result.nc_latency.get_latency_percentile(p)`` (microseconds).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .cost import CostEstimate, from_usage
from .errors import NkiUnsupportedError
from .launch import Kernel, jit


@dataclass(frozen=True)
class LatencyResult:
    """Latency percentiles in microseconds: the cost estimate at every percentile."""

    estimate: CostEstimate

    def get_latency_percentile(self, percentile: int) -> float:
        if not 0 <= percentile <= 100:
            raise ValueError(f"percentile {percentile} is not in 0..100")
        return self.estimate.estimated_s * 1e6


@dataclass(frozen=True)
class BenchmarkResult:
    nc_latency: LatencyResult


class BenchmarkKernel:
    """A kernel under ``nki.benchmark``: calling it runs the kernel and fills
    ``benchmark_result``; ``kernel[grid]`` launches an SPMD grid the same way."""

    def __init__(self, kernel: Kernel, warmup: int, iters: int, refused: str = "") -> None:
        if warmup < 0 or iters < 1:
            raise ValueError(f"nki.benchmark: warmup {warmup} must be >= 0, iters {iters} >= 1")
        self.kernel = kernel
        self.refused = refused  # why running it is refused (options it cannot honour)
        self.warmup, self.iters = warmup, iters
        self.benchmark_result: BenchmarkResult | None = None
        self._launch: Kernel = kernel

    def __getitem__(self, grid: Any) -> BenchmarkKernel:
        launched = BenchmarkKernel(self.kernel, self.warmup, self.iters, self.refused)
        launched._launch = self.kernel[grid]
        return launched

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.refused:
            raise NkiUnsupportedError(self.refused)
        result = self._launch(*args, **kwargs)
        usage = self._launch.last_usage
        assert usage is not None
        self.benchmark_result = BenchmarkResult(LatencyResult(from_usage(usage)))
        return result


def benchmark(
    kernel: Callable[..., Any] | None = None,
    *,
    warmup: int = 5,
    iters: int = 10,
    save_neff_name: str | None = None,
    save_trace_name: str | None = None,
    additional_compile_opt: str | None = None,
    device_count: int = 1,
    **options: Any,
) -> Any:
    """``@nki.benchmark(warmup=..., iters=...)``: see the module docstring. A kernel asking
    for Trainium's artefacts (a NEFF, a profile trace, compiler flags) or several devices is
    refused when it runs (NkiUnsupportedError): nothing here can produce them."""
    refused = ""
    asked = {
        "save_neff_name": save_neff_name,
        "save_trace_name": save_trace_name,
        "additional_compile_opt": additional_compile_opt,
    }
    for name, value in asked.items():
        if value:
            refused = (
                f"nki.benchmark({name}={value!r}): the software NeuronCore compiles no NEFF "
                "and records no device profile; leave it unset (the latency reported is the "
                "kernel's cost estimate, docs/nki.md)"
            )
    if device_count != 1:
        refused = f"nki.benchmark(device_count={device_count}): one device only"

    def wrap(fn: Callable[..., Any]) -> BenchmarkKernel:
        return BenchmarkKernel(jit(fn, **options), warmup, iters, refused)

    return wrap if kernel is None else wrap(kernel)


class _ProfiledKernel:
    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __getitem__(self, grid: Any) -> _ProfiledKernel:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NkiUnsupportedError(
            "nki.profile runs a kernel on a NeuronDevice to record a NEFF and a device trace; "
            "the software NeuronCore records neither. Use nki.jit to run the kernel and "
            "nki.estimate(kernel, *args) for its estimated cost per engine"
        )


def profile(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """``@nki.profile(working_directory=..., save_neff_name=..., ...)``: decorating works so
    a module that profiles one kernel still imports; calling the kernel is refused (see
    _ProfiledKernel)."""
    return _ProfiledKernel if fn is None else _ProfiledKernel(fn)
