"""The compiled path: a traced kernel turned into straight-line numpy code.

The interpreter's run of a kernel for one input signature records every instruction
(:class:`.interpreter.Step`). Control flow, index expressions and shapes depend only on that
signature (tile values cannot steer a kernel), so the recording *is* the program for every
call with the same signature. This module emits it as one Python function of the input and
output arrays:

* on-chip tiles become preallocated scratch arrays; tiles whose lifetimes do not overlap
  share one array (slot), so the working set stays cache-sized however long the kernel;
* basic-indexed views of scratch are computed once, at build time;
* Tensor Engine matmuls into float32 PSUM run as ``torch.mm(..., out=)`` on CPU tensor
  views of the tiles (the interpreter's matmul is the same torch.mm, so results agree bit
  for bit; accumulation is the same float32 add after it);
* elementwise instructions into float32 tiles run as numpy ufuncs writing in place
  (``out=``), copies and DMAs as ``np.copyto``; the rest call the instruction's own
  numpy body, the very function the interpreter ran;
* checks (sizes, capacities, dtypes) already passed during the trace and are not repeated.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..compile.cache_trust import NeffCacheSecurityError
from . import cxx_build, dtypes, fusion, loop_batching, matmul_grid, ops, row_programs
from .interpreter import Launch, Ref, Step, _identity, fit_value
from .tiles import resolve_keys


class CompiledKernel:
    """The generated function plus the scratch memory it owns (one call at a time)."""

    def __init__(
        self, source: str, run: Callable[..., None], slots: int, batched_steps: int = 0
    ) -> None:
        self.source = source
        self._run = run
        self.slots = slots
        self.batched_steps = batched_steps  # steps that run a whole affine_range loop
        self.row_programs = 0  # runs of row-wise steps compiled to C++ (row_programs.py)
        self.keep: Any = None
        self._lock = threading.Lock()

    def __call__(self, arrays: list[np.ndarray]) -> None:
        with self._lock:
            self._run(*arrays)


def _generic_write(
    view: np.ndarray, adv: Any, dtype: Any, values: Any, mask: Any, mode: str
) -> None:
    shape = view.shape if adv is None else view[adv].shape
    values = fit_value(values, shape)
    if mode == "acc":
        current = view if adv is None else view[adv]
        values = current.astype(np.float32) + values
    if dtypes.needs_rounding(dtype):
        values = dtypes.round_to(values, dtype)
    if mask is None:
        if adv is None:
            np.copyto(view, values, casting="unsafe")
        else:
            view[adv] = values
        return
    where = np.broadcast_to(np.asarray(mask, dtype=bool), shape)
    if adv is None:
        np.copyto(view, values, casting="unsafe", where=where)
    elif all(isinstance(k, (int, np.ndarray)) for k in adv):
        picked = tuple(
            np.broadcast_to(k, shape)[where] if isinstance(k, np.ndarray) else k for k in adv
        )
        view[picked] = values[where]
    else:
        view[adv] = np.where(where, values, view[adv])


class _Builder:
    def __init__(self, launch: Launch, dtype_of: dict[int, Any]) -> None:
        self.launch = launch
        self.dtype_of = dtype_of  # sid -> NKI dtype
        self.names: dict[str, Any] = {
            "np": np,
            "torch": torch,
            "_write": _generic_write,
            "_fit": fit_value,
            "_t": _torch_view,
            "_split": _split_rows,
            "_repeat": _repeat_rows,
            "_pad": ops.pad,
        }
        self.matmul_temps: dict[tuple[int, ...], str] = {}
        self.counter = 0
        self.lines: list[str] = []
        self.slot_of: dict[int, np.ndarray] = {}

    def const(self, value: Any, prefix: str = "C") -> str:
        name = f"{prefix}{self.counter}"
        self.counter += 1
        self.names[name] = value
        return name

    # -- storage placement ---------------------------------------------------------------
    def place_scratch(self, steps: list[Step]) -> int:
        """Gives each scratch storage an array; storages alive at disjoint times share."""
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for n, step in enumerate(steps):
            for sid in _sids(step):
                if self.launch.roles[sid][0] == "scratch":
                    first.setdefault(sid, n)
                    last[sid] = n
        ends: dict[int, list[int]] = defaultdict(list)
        for sid, n in last.items():
            ends[n].append(sid)
        free: dict[tuple[Any, ...], list[np.ndarray]] = defaultdict(list)
        count = 0
        for n, step in enumerate(steps):
            for sid in _sids(step):
                if first.get(sid) == n and sid not in self.slot_of:
                    template = self.launch.arrays[sid]
                    key = (template.shape, template.dtype.str)
                    if free[key]:
                        self.slot_of[sid] = free[key].pop()
                    else:
                        self.slot_of[sid] = np.zeros(template.shape, template.dtype)
                        count += 1
            for sid in ends.get(n, ()):
                array = self.slot_of[sid]
                free[(array.shape, array.dtype.str)].append(array)
        return count

    # -- expressions ---------------------------------------------------------------------
    def base_view(self, ref: Ref) -> str:
        role, index = self.launch.roles[ref.sid]
        if role == "scratch":
            view = resolve_keys(self.slot_of[ref.sid], ref.keys)
            return self.const(view, "S")
        expr = f"a{index}" if role == "input" else f"o{index}"
        for key in ref.keys:
            if isinstance(key, tuple) and len(key) == 2 and key[0] == "reshape":
                expr = f"{expr}.reshape({key[1]!r})"
            else:
                expr = f"{expr}[{self.const(key, 'K')}]"
        return expr

    def read(self, ref: Ref) -> str:
        view = self.base_view(ref)
        return view if ref.adv is None else f"{view}[{self.const(ref.adv, 'K')}]"

    def storage_dtype(self, ref: Ref) -> np.dtype:
        return self.launch.arrays[ref.sid].dtype

    # -- steps ---------------------------------------------------------------------------
    def emit(self, step: Step, covered: set[int]) -> None:
        if step.engine == "alloc":
            sid = step.allocated
            if sid is not None and sid not in covered:
                self.lines.append(f"{self.const(self.slot_of[sid], 'S')}.fill(0)")
            return
        if step.batch is not None and self._emit_batched(step, step.batch[0]):
            return
        args = [self.read(x) if isinstance(x, Ref) else self.const(x) for x in step.ins]
        if len(step.outs) == 1:
            dst, mask, mode = step.outs[0]
            simple = (
                mask is None
                and dst.adv is None
                and not dtypes.needs_rounding(self.dtype_of[dst.sid])
            )
            matmul = step.fn in (ops.matmul_fn, fusion.fused_matmul_fn, fusion.fused_matmul_nt_fn)
            if simple and matmul and self._emit_matmul(step, dst, mode):
                return
            if simple and self._emit_fast(step, args, dst, mode):
                return
        self._emit_call(step, args)

    def _emit_call(self, step: Step, args: list[str]) -> None:
        call = f"{self.const(step.fn, 'F')}({', '.join(args)})"
        if len(step.outs) == 1:
            self._emit_write(step.outs[0], call)
            return
        self.lines.append(f"r = {call}")
        for n, out in enumerate(step.outs):
            self._emit_write(out, f"r[{n}]")

    # -- batched loops (loop_batching.py) -------------------------------------------------
    def _wide(self, x: Any) -> bool:
        """An operand every iteration reads whole, with more than one row: it broadcasts
        against one iteration's rows, not against all of them stacked."""
        if not isinstance(x, Ref) or x.stacked:
            return False
        view = resolve_keys(self.launch.arrays[x.sid], x.keys)
        return view.ndim > 0 and view.shape[0] > 1

    def split(self, ref: Ref, count: int) -> str:
        """A stacked access as [iterations, rows, ...] (a view)."""
        if self.launch.roles[ref.sid][0] == "scratch":
            view = resolve_keys(self.slot_of[ref.sid], ref.keys)
            return self.const(_split_rows(view, count), "S")
        return f"_split({self.base_view(ref)}, {count})"

    def _emit_batched(self, step: Step, count: int) -> bool:
        """Emits a batched step with wide operands (others take the ordinary path, their
        stacked accesses being plain views): elementwise fast paths see the stacked
        operands split per iteration, so the wide ones broadcast; anything else gets the
        wide operands repeated for every iteration."""
        if not any(self._wide(x) for x in step.ins):
            return False
        if len(step.outs) == 1 and not dtypes.needs_rounding(self.dtype_of[step.outs[0][0].sid]):
            dst, _, mode = step.outs[0]
            args = [
                self.split(x, count)
                if isinstance(x, Ref) and x.stacked
                else self.read(x)
                if isinstance(x, Ref)
                else self.const(x)
                for x in step.ins
            ]
            if self._emit_fast(step, args, dst, mode, self.split(dst, count)):
                return True
        args = [
            f"_repeat({self.read(x)}, {count})"
            if self._wide(x)
            else self.read(x)
            if isinstance(x, Ref)
            else self.const(x)
            for x in step.ins
        ]
        self._emit_call(step, args)
        return True

    def torch_operand(self, ref: Ref) -> str:
        if self.launch.roles[ref.sid][0] == "scratch":
            view = resolve_keys(self.slot_of[ref.sid], ref.keys)
            return self.const(torch.from_numpy(view), "T")
        return f"_t({self.base_view(ref)})"

    def _emit_matmul(self, step: Step, dst: Ref, mode: str) -> bool:
        refs = [x for x in step.ins if isinstance(x, Ref)]
        if len(refs) != 2 or len(step.ins) != 2:
            return False
        if any(x.adv is not None or self.storage_dtype(x) != np.float32 for x in refs):
            return False
        if self.storage_dtype(dst) != np.float32:
            return False
        if self.launch.roles[dst.sid][0] == "input":
            return False  # written through a torch view: tiles and outputs (inputs: generic)
        for ref in [*refs, dst]:
            if self.launch.roles[ref.sid][0] == "scratch":
                view = resolve_keys(self.slot_of[ref.sid], ref.keys)
            else:
                view = resolve_keys(self.launch.arrays[ref.sid], ref.keys)
            if any(stride < 0 for stride in view.strides):
                return False  # torch.from_numpy takes no negative strides
        stationary, moving = (self.torch_operand(x) for x in refs)
        target = self.torch_operand(dst)
        # stationary.T @ moving; a chain over transposed tiles holds the untransposed tile
        left = stationary if step.fn is fusion.fused_matmul_nt_fn else f"{stationary}.T"
        if mode == "set":
            self.lines.append(f"torch.mm({left}, {moving}, out={target})")
            return True
        rows_axis = 0 if step.fn is fusion.fused_matmul_nt_fn else 1
        m = resolve_keys(self.launch.arrays[refs[0].sid], refs[0].keys).shape[rows_axis]
        n = resolve_keys(self.launch.arrays[refs[1].sid], refs[1].keys).shape[1]
        temp = self.matmul_temps.get((m, n))
        if temp is None:
            temp = self.const(torch.zeros((m, n), dtype=torch.float32), "P")
            self.matmul_temps[(m, n)] = temp
        self.lines.append(f"torch.mm({left}, {moving}, out={temp})")
        self.lines.append(f"{target}.add_({temp})")
        return True

    def _emit_fast(
        self, step: Step, args: list[str], dst: Ref, mode: str, dst_view: str | None = None
    ) -> bool:
        split = dst_view is not None  # operands as [iterations, rows, ...] (batched loop)
        dst_view = dst_view or self.base_view(dst)
        if step.fn is _identity:
            if mode == "acc":
                self.lines.append(
                    f"np.add({dst_view}, {args[0]}, out={dst_view}, casting='unsafe')"
                )
            else:
                self.lines.append(
                    f"np.copyto({dst_view}, _fit({args[0]}, {dst_view}.shape), casting='unsafe')"
                )
            return True
        ufunc = getattr(step.fn, "ufunc", None)
        aligned = getattr(step.fn, "aligned_ufunc", None)
        if ufunc is None and aligned is not None and not split:
            # Operands of different ranks meet on the partition axis: pad, then the ufunc.
            ufunc = aligned[0]
            args = [f"_pad({arg}, {aligned[1]})" for arg in args]
        float_inputs = all(
            self.storage_dtype(x) == np.float32
            if isinstance(x, Ref)
            else isinstance(x, (float, int))
            for x in step.ins
        )
        if (
            ufunc is not None
            and mode == "set"
            and float_inputs
            and self.storage_dtype(dst) == np.float32
            and ufunc.nout == 1
            and not ufunc.__name__.startswith(("equal", "not_equal", "greater", "less", "logical"))
        ):
            self.lines.append(f"{self.const(ufunc, 'U')}({', '.join(args)}, out={dst_view})")
            return True
        return False

    def _emit_write(self, out: tuple[Ref, Any, str], value: str) -> None:
        dst, mask, mode = out
        view = self.base_view(dst)
        dtype = self.dtype_of[dst.sid]
        if mask is None and dst.adv is None and mode == "set" and not dtypes.needs_rounding(dtype):
            # _fit: a value differing from the tile only in unit dimensions, as the
            # interpreter accepts it (interpreter.fit_value)
            self.lines.append(f"np.copyto({view}, _fit({value}, {view}.shape), casting='unsafe')")
            return
        adv = self.const(dst.adv, "K") if dst.adv is not None else "None"
        mask_name = self.const(mask, "M") if mask is not None else "None"
        self.lines.append(
            f"_write({view}, {adv}, {self.const(dtype, 'D')}, {value}, {mask_name}, {mode!r})"
        )


def _split_rows(array: np.ndarray, count: int) -> np.ndarray:
    """[count * rows, ...] as [count, rows, ...], a view (any row stride splits)."""
    rows = array.shape[0] // count
    return np.lib.stride_tricks.as_strided(
        array,
        (count, rows) + array.shape[1:],
        (rows * array.strides[0],) + array.strides,
        writeable=array.flags.writeable,
    )


def _repeat_rows(array: np.ndarray, count: int) -> np.ndarray:
    """`array` stacked `count` times along its rows (a copy)."""
    return np.broadcast_to(array, (count,) + array.shape).reshape(
        (count * array.shape[0],) + array.shape[1:]
    )


def _torch_view(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor over an HBM operand read by a matmul (a copy if torch cannot view it:
    read-only memory or negative strides, which the signature does not capture)."""
    if not array.flags.writeable or any(stride < 0 for stride in array.strides):
        array = array.copy()
    return torch.from_numpy(array)


def _sids(step: Step) -> list[int]:
    sids = [x.sid for x in step.ins if isinstance(x, Ref)] + [o[0].sid for o in step.outs]
    if step.allocated is not None:
        sids.append(step.allocated)
    return sids


def _covering_first_writes(launch: Launch, steps: list[Step]) -> set[int]:
    """Scratch storages whose first access after allocation is an unmasked write of all of
    it (they need no zero fill)."""
    seen: set[int] = set()
    covered: set[int] = set()
    for step in steps:
        if step.engine == "alloc":
            continue
        for x in step.ins:
            if isinstance(x, Ref):
                seen.add(x.sid)
        for dst, mask, mode in step.outs:
            if dst.sid in seen:
                continue
            seen.add(dst.sid)
            if mask is None and mode == "set" and dst.adv is None and not dst.keys:
                covered.add(dst.sid)
    return covered


def written_before_read(launch: Launch, n_outputs: int) -> list[bool]:
    """Per output: does the kernel write every element before anything reads it? Those
    outputs need no zero fill (on the chip, HBM tensors start uninitialised; the fill of a
    fresh multi-MiB array is a pass over memory plus page faults)."""
    steps = launch.steps or []
    result = []
    for index in range(n_outputs):
        sids = [sid for sid, role in launch.roles.items() if role == ("output", index)]
        if len(sids) != 1:
            result.append(False)
            continue
        sid = sids[0]
        cover = np.zeros(launch.arrays[sid].shape, bool)
        ok = True
        for step in steps:
            if any(isinstance(x, Ref) and x.sid == sid for x in step.ins):
                ok = False  # read (or accumulated into) before being known to be covered
                break
            for dst, mask, mode in step.outs:
                if dst.sid != sid:
                    continue
                if mode != "set":
                    ok = False
                    break
                view = resolve_keys(cover, dst.keys)
                if dst.adv is not None:
                    view = view[dst.adv]  # a copy: advanced indexing
                    ok = False  # coverage through gathers is not tracked
                    break
                if mask is None:
                    view[...] = True
                else:
                    np.logical_or(
                        view, np.broadcast_to(np.asarray(mask, bool), view.shape), out=view
                    )
            if not ok:
                break
        result.append(ok and bool(cover.all()))
    return result


def _planned_steps(launch: Launch, chunk_bytes: int | None) -> list[Step]:
    steps = loop_batching.batch_loops(launch, fusion.plan(launch, launch.steps or []), chunk_bytes)
    steps = fusion.store_in_place(launch, fusion.elide_loads(launch, steps))
    return matmul_grid.merge_matmul_grid(launch, steps)


def build(launch: Launch, n_inputs: int, n_outputs: int) -> CompiledKernel:
    plain = _emit_program(launch, _planned_steps(launch, None), n_inputs, n_outputs, rows=False)
    if row_programs.mode() == "never":
        return plain
    try:
        steps = _planned_steps(launch, 0)  # whole loops: a row program streams the rows
        return _emit_program(launch, steps, n_inputs, n_outputs, rows=True, fallback=plain)
    except NeffCacheSecurityError:
        raise  # an untrusted cache is the user's to fix, not a reason to go slow silently
    except (cxx_build.CxxUnavailable, OSError) as error:
        row_programs.warn_unavailable(error)
        return plain


def _emit_program(
    launch: Launch,
    steps: list[Step],
    n_inputs: int,
    n_outputs: int,
    rows: bool,
    fallback: CompiledKernel | None = None,
) -> CompiledKernel:
    """The numpy program, or with rows=True the same with row-wise runs in C++ (the plain
    program is returned when no run is worth it)."""
    builder = _Builder(launch, launch.nki_dtypes)
    slots = builder.place_scratch(steps)
    covered = _covering_first_writes(launch, steps)
    params = [f"a{i}" for i in range(n_inputs)] + [f"o{i}" for i in range(n_outputs)]
    items: list[tuple[str, Any]] = [("step", step) for step in steps]
    runs = 0
    if rows:
        programs = row_programs.RowPrograms(launch, builder.slot_of, n_inputs, n_outputs)
        items = programs.plan(steps, covered)
        if not programs.runs:
            assert fallback is not None
            return fallback
        linked = programs.link()
        runs = len(programs.runs)
        builder.names.update({"_fill": linked.fill, "_table": linked.table})
        builder.names.update({f"_run{n}": fn for n, fn in enumerate(linked.functions)})
        builder.lines.append(f"_fill({', '.join(params)})")
    for kind, item in items:
        if kind == "run":
            builder.lines.append(f"_run{item}(_table)")
        else:
            builder.emit(item, covered)
    body = builder.lines or ["pass"]
    source = f"def kernel({', '.join(params)}):\n" + "".join(f"    {line}\n" for line in body)
    namespace = dict(builder.names)
    exec(compile(source, "<nki compiled kernel>", "exec"), namespace)  # noqa: S102
    batched = sum(1 for step in steps if step.batch is not None and step.engine != "alloc")
    kernel = CompiledKernel(source, namespace["kernel"], slots, batched)
    kernel.row_programs = runs
    kernel.keep = linked if rows else None  # the table and its arrays live with the kernel
    return kernel
