"""``nki.jit`` and launches: SPMD grids, argument conversion, the per-signature compile cache.

Calling a kernel runs every program instance of its launch grid (``kernel[g0, g1](...)``)
in order on the host. The first call with a given input signature (shapes, dtypes,
non-tensor arguments, grid, target chip) runs the interpreter while recording; the
recording is compiled (:mod:`.codegen`) and later calls with that signature run the
compiled code. ``TORCHNEURON_NKI_EXECUTION=interpret`` runs the interpreter every time.
"""

from __future__ import annotations

import functools
import itertools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .. import _C
from . import codegen, interpreter, row_programs
from .chip_profile import target_name
from .cost import CostEstimate, from_usage
from .errors import NkiError
from .hbm_io import Allocator, HbmArg, Shadows, launch_device, to_hbm, write_back
from .interpreter import Launch, Usage
from .tiles import Storage, Tile, hbm, resolve_keys


@dataclass
class _Compiled:
    program: codegen.CompiledKernel
    outputs: list[tuple[tuple[int, ...], Any]]  # (shape, NKI dtype) per shared_hbm output
    uninitialized: list[bool]  # per output: written whole before any read (no zero fill)
    result: Any  # the kernel's return structure, tiles replaced by ("input"|"output", i, keys)
    usage: Usage


_HOST = Allocator(None)  # results of numpy-argument launches (stateless for the host)


def _outputs(entry: _Compiled, allocator: Allocator) -> list[np.ndarray]:
    """A compiled launch's output arrays: left uninitialised where the program writes them
    whole before reading them, zeros elsewhere."""
    return [
        allocator(shape, dtype, fill=None if bare else 0)
        for (shape, dtype), bare in zip(entry.outputs, entry.uninitialized, strict=True)
    ]


def _fast_key(args: tuple[Any, ...]) -> Any:
    """The key of a call whose arguments are numpy arrays of numpy's own numeric dtypes and
    plain scalars, with the settings a compiled program depends on; None for other calls."""
    parts: list[Any] = []
    for a in args:
        if type(a) is np.ndarray:
            if a.dtype.kind not in "fiub":  # ml_dtypes' bfloat16 runs on a float32 copy
                return None
            parts.append((a.shape, a.strides, a.dtype))
        elif type(a) in (int, float, bool):
            parts.append((type(a), a))
        else:
            return None
    return tuple(parts), target_name(), row_programs.mode()


def _signature_of(value: Any) -> Any:
    arg = value if isinstance(value, HbmArg) else None
    if arg is not None:
        # strides too: compiled row programs address HBM by element offsets
        return ("tensor", arg.array.shape, arg.array.strides, _dtype_key(arg.dtype))
    try:
        hash(value)
        return ("value", type(value).__name__, value)
    except TypeError:
        return ("repr", repr(value))


@functools.lru_cache(maxsize=64)
def _dtype_key(dtype: Any) -> str:
    return str(dtype)  # numpy's dtype __str__ costs ~0.2 ms per call: once per dtype


def _execution_mode() -> str:
    """``compiled`` or ``interpret``: TORCHNEURON_NKI_EXECUTION, or NKI_SIMULATOR=1 (AWS's
    switch that runs every ``nki.jit`` kernel in its CPU simulator: here, the interpreter)."""
    mode = os.environ.get("TORCHNEURON_NKI_EXECUTION")
    if mode not in (None, "compiled", "interpret"):
        raise ValueError(f"TORCHNEURON_NKI_EXECUTION={mode!r}: use 'compiled' or 'interpret'")
    if interpreter.simulator_requested():
        if mode == "compiled":
            raise ValueError(
                "NKI_SIMULATOR=1 runs every kernel in the simulator (the interpreter) and "
                "TORCHNEURON_NKI_EXECUTION=compiled asks for the compiled path: unset one"
            )
        return "interpret"
    return mode or "compiled"


class Kernel:
    """A kernel function made launchable by ``@nki.jit``."""

    def __init__(
        self, fn: Callable[..., Any], mode: str = "auto", grid: tuple[int, ...] = (), **options: Any
    ) -> None:
        self.fn = fn
        self.mode = mode
        self.grid = grid
        self.options = options
        self._cache: dict[Any, _Compiled] = {}
        self._fast: dict[Any, _Compiled] = {}  # numpy-argument calls already compiled
        self._launches: dict[tuple[int, ...], Kernel] = {}  # kernel[grid], by grid
        self.last_usage: Usage | None = None
        # seconds the compiled program of the last cached call ran (the rest of the call is
        # the launch: benchmarks/nki.py reports it)
        self.last_program_s = 0.0
        functools.update_wrapper(self, fn)

    def __getitem__(self, grid: Any) -> Kernel:
        dims = grid if isinstance(grid, tuple) else (grid,)
        try:
            ints = tuple(int(d) for d in dims)
        except TypeError:
            raise NkiError(f"a launch grid is one or more positive ints, got {grid!r}") from None
        launched = self._launches.get(ints)
        if launched is None:
            if not ints or any(d < 1 for d in ints):
                raise NkiError(f"a launch grid is one or more positive ints, got {grid!r}")
            launched = Kernel(self.fn, self.mode, ints, **self.options)
            launched._cache = self._cache  # one cache per kernel; the grid is part of the key
            launched._launches = self._launches
            self._launches[ints] = launched  # `kernel[g](...)` in a loop builds it once
        return launched

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if interpreter.active() is not None:
            return self.fn(*args, **kwargs)  # a sub-kernel: traced into its caller
        if self.mode == "trace":
            raise NkiError("a kernel with mode='trace' runs only when called from another kernel")
        compiled = _execution_mode() == "compiled"
        if compiled and not kwargs and self._fast:
            entry = self._fast.get(_fast_key(args))
            if entry is not None:
                return self._run_fast(entry, args)
        return self.run(args, kwargs, compiled=compiled)

    def _run_fast(self, entry: _Compiled, args: tuple[Any, ...]) -> Any:
        """A call whose arguments are numpy arrays (and scalars) of a signature already
        compiled: what _run does for it, without the argument wrappers. Every launch pays
        this part on top of its program (benchmarks/nki.py's "launch" column)."""
        _C._wait_for_device_work()
        outputs = _outputs(entry, _HOST)
        arrays = [a for a in args if type(a) is np.ndarray]
        with np.errstate(all="ignore"):
            started = time.perf_counter()
            entry.program(arrays + outputs)
            self.last_program_s = time.perf_counter() - started
        self.last_usage = entry.usage
        return _build_results(entry.result, arrays, outputs, entry.outputs, _HOST)

    def cost(self, *args: Any, **kwargs: Any) -> CostEstimate:
        """Runs the kernel once with these arguments (traced on first use of the signature,
        compiled after) and returns its estimated cost on the target chip
        (NEURON_PLATFORM_TARGET_OVERRIDE)."""
        self(*args, **kwargs)
        assert self.last_usage is not None
        return from_usage(self.last_usage)

    def interpret(self, *args: Any, **kwargs: Any) -> Any:
        """Runs the reference interpreter (no compiled code), whatever the setting."""
        return self.run(args, kwargs, compiled=False)

    # -- launch --------------------------------------------------------------------------
    def run(self, args: tuple[Any, ...], kwargs: dict[str, Any], compiled: bool) -> Any:
        # The interpreter runs single-threaded: its tile-sized torch.mm calls lose to thread
        # hand-offs on a shared host. The compiled path leaves the thread count alone:
        # changing it is global, and every torch op after the kernel then paid for the
        # OpenMP pool's resize (a 0.4 ms linear took 30 ms on a loaded host).
        threads = 1 if compiled else torch.get_num_threads()
        toggle = threads != 1
        if toggle:
            torch.set_num_threads(1)
        try:
            # Engines follow IEEE arithmetic silently (e.g. rsqrt of a masked-off zero row).
            with np.errstate(all="ignore"):
                return self._run(args, kwargs, compiled)
        finally:
            if toggle:
                torch.set_num_threads(threads)

    def _run(self, args: tuple[Any, ...], kwargs: dict[str, Any], compiled: bool) -> Any:
        device = launch_device(list(args) + list(kwargs.values()))
        # The kernel reads and writes device memory from this thread: launched ops first.
        _C._wait_for_device_work()
        converted = [to_hbm(a) or a for a in args]
        converted_kw = {k: to_hbm(v) or v for k, v in kwargs.items()}
        hbm_args = [
            a for a in itertools.chain(converted, converted_kw.values()) if isinstance(a, HbmArg)
        ]
        allocator = Allocator(device)
        key = (
            self.grid,
            tuple(_signature_of(a) for a in converted),
            tuple(sorted((k, _signature_of(v)) for k, v in converted_kw.items())),
            target_name(),
            row_programs.mode() if compiled else None,
        )
        entry = self._cache.get(key) if compiled else None
        if entry is not None:
            fast = _fast_key(args) if not kwargs else None
            if fast is not None:
                self._fast[fast] = entry
            outputs = _outputs(entry, allocator)
            started = time.perf_counter()
            entry.program([a.array for a in hbm_args] + outputs)
            self.last_program_s = time.perf_counter() - started
            self.last_usage = entry.usage
            write_back(hbm_args)
            return self._results(
                entry.result, [a.array for a in hbm_args], outputs, entry.outputs, allocator
            )
        launch = Launch(self.grid, allocator, record=compiled)
        shadows = Shadows(hbm_args)
        try:
            result = self._interpret(launch, converted, converted_kw, hbm_args)
        except BaseException:
            shadows.discard()  # refused: the caller's arguments are as they were
            raise
        shadows.commit(launch.inputs_written)
        self.last_usage = launch.usage
        outputs = [s.array for s in launch.shared]
        meta = [(s.array.shape, s.dtype) for s in launch.shared]
        spec = _result_spec(result)
        # A data-dependent launch recorded one control path of several, access patterns are
        # not lowered, random numbers drawn while tracing would repeat, and the Vector
        # Engine's accumulator lives on the launch: such launches are not kept, so each call
        # traces the kernel again (control_flow.py, access_patterns.py, random_numbers.py,
        # isa_accumulate.py).
        drew = launch.random is not None
        accumulated = launch.vector_accumulator is not None
        replayable = not (
            launch.data_dependent or launch.uses_access_patterns or drew or accumulated
        )
        if compiled and replayable:
            program = codegen.build(launch, len(hbm_args), len(outputs))
            bare = codegen.written_before_read(launch, len(outputs))
            self._cache[key] = _Compiled(program, meta, bare, spec, launch.usage)
        write_back(hbm_args)
        return self._results(spec, [a.array for a in hbm_args], outputs, meta, allocator)

    def _interpret(
        self, launch: Launch, args: list[Any], kwargs: dict[str, Any], hbm_args: list[HbmArg]
    ) -> Any:
        def tensor(arg: Any) -> Any:
            if not isinstance(arg, HbmArg):
                return arg
            storage = Storage(arg.array, hbm, arg.dtype, 0)
            storage.role = ("input", next(n for n, h in enumerate(hbm_args) if h is arg))
            return Tile(storage)

        kernel_args = [tensor(a) for a in args]
        kernel_kwargs = {k: tensor(v) for k, v in kwargs.items()}
        previous = interpreter.enter(launch)
        try:
            result = None
            for pid in itertools.product(*(range(d) for d in self.grid)):
                launch.program_ids = pid
                launch.shared_cursor = 0
                result = self.fn(*kernel_args, **kernel_kwargs)
            launch.check_occupancy()  # before any result reaches the caller
            return result
        finally:
            interpreter.enter(previous)

    def _results(
        self,
        spec: Any,
        inputs: list[np.ndarray],
        outputs: list[np.ndarray],
        meta: list[tuple[tuple[int, ...], Any]],
        allocator: Allocator,
    ) -> Any:
        return _build_results(spec, inputs, outputs, meta, allocator)


def _build_results(
    item: Any,
    inputs: list[np.ndarray],
    outputs: list[np.ndarray],
    meta: list[tuple[tuple[int, ...], Any]],
    allocator: Allocator,
) -> Any:
    """The kernel's return structure with its tiles replaced by arrays or tensors. (A
    module function, not a recursive closure: that closure would be a reference cycle
    holding every output until the garbage collector runs, so each call's multi-MiB
    outputs would be fresh, page-faulting memory.)"""
    if isinstance(item, tuple) and len(item) == 4 and item[0] == "__tile__":
        _, role, index, keys = item
        if role == "output":
            array = outputs[index]
            if not keys:
                return allocator.result(array, meta[index][1])
            return allocator.result(np.ascontiguousarray(resolve_keys(array, keys)), meta[index][1])
        return allocator.result(np.ascontiguousarray(resolve_keys(inputs[index], keys)), None)
    if isinstance(item, (tuple, list)):
        return type(item)(_build_results(x, inputs, outputs, meta, allocator) for x in item)
    if isinstance(item, dict):
        return {k: _build_results(v, inputs, outputs, meta, allocator) for k, v in item.items()}
    return item


def _result_spec(result: Any) -> Any:
    if isinstance(result, Tile):
        if result.buffer.on_chip:
            raise NkiError("a kernel returns HBM tensors (nl.shared_hbm), not on-chip tiles")
        role = result.storage.role
        if role is None or role[0] == "scratch":
            raise NkiError("a kernel returns tensors allocated in nl.shared_hbm or its inputs")
        if result.adv is not None:
            raise NkiError("a kernel cannot return an expression-indexed view")
        return ("__tile__", role[0], role[1], result.keys)
    if isinstance(result, (tuple, list)):
        return type(result)(_result_spec(x) for x in result)
    if isinstance(result, dict):
        return {k: _result_spec(v) for k, v in result.items()}
    return result


def jit(fn: Callable[..., Any] | None = None, *, mode: str = "auto", **options: Any) -> Any:
    """Makes `fn` an NKI kernel (``@nki.jit`` or ``@nki.jit(mode=...)``)."""
    if fn is None:
        return lambda f: Kernel(f, mode, **options)
    if isinstance(fn, Kernel):
        return fn
    return Kernel(fn, mode, **options)


def baremetal(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """Legacy ``nki.baremetal``: a kernel called with numpy arrays (same as jit here)."""
    return jit(fn, mode="baremetal", **options)


def simulate_kernel(kernel: Any, *args: Any, **kwargs: Any) -> Any:
    """Legacy ``nki.simulate_kernel(kernel[grid], *args)``: runs the reference interpreter."""
    target = kernel if isinstance(kernel, Kernel) else Kernel(kernel)
    return target.interpret(*args, **kwargs)


def simulate(kernel: Any, *args: Any, **kwargs: Any) -> Any:
    """New-style ``nki.simulate``: ``nki.simulate(kernel)(*args)`` or
    ``nki.simulate(kernel, *args)``; runs the reference interpreter."""
    target = kernel if isinstance(kernel, Kernel) else Kernel(kernel)
    if args or kwargs:
        return target.interpret(*args, **kwargs)
    return target.interpret


def estimate(kernel: Any, *args: Any, **kwargs: Any) -> CostEstimate:
    """``nki.estimate``: `kernel` (an ``@nki.jit`` kernel, or a launch ``kernel[grid]``) run
    once with these arguments, and its cost estimate on the target chip (:meth:`Kernel.cost`)."""
    if not isinstance(kernel, Kernel):
        raise TypeError(f"nki.estimate takes an @nki.jit kernel, got {type(kernel).__name__}")
    return kernel.cost(*args, **kwargs)
