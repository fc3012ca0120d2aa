"""OpInfo conformance harness: PyTorch's op database run on ``neuron`` against the CPU.

For every OpInfo of ``torch.testing._internal.common_methods_invocations.op_db`` and every
dtype of float32, bfloat16, float16, int64 and bool that the op supports on the CPU, the
OpInfo's sample inputs are generated on the CPU (fixed seed), copied to ``neuron`` (same
sizes, strides and storage offsets), and the op runs on both. Results are compared with
``torch.testing.assert_close``:

* forward outputs for every dtype; tensors must come back on ``neuron``; inputs the op
  writes to are compared after the call too; an output that is a view of an input on the
  CPU must be a view of the same input on ``neuron``;
* gradients of the inputs for differentiable ops in float32: ``torch.autograd.grad`` of the
  outputs with a fixed random cotangent, on both devices.

Tolerances: ``torch.testing.assert_close``'s defaults for the output's dtype (float32
rtol 1.3e-6 / atol 1e-5, bfloat16 1.6e-2 / 1e-5, float16 1e-3 / 1e-5, integers and bool
exact), NaN equal to NaN. A sample outside them still passes when the OpInfo itself declares
a looser tolerance for that dtype (``toleranceOverride`` / ``precisionOverride`` for CPU or
any device); the report counts those. Ops whose values are random or undefined (``RANDOM_OPS``)
and samples whose CPU result is not reproducible from run to run are compared by shape,
dtype, layout and device only, and the report lists them.

Each (op, dtype, sample) is one of: ``pass``; ``fail`` (a mismatch: values, dtype, shape,
device, aliasing); ``error`` (an exception on neuron only, or a crash or timeout of the
sample); ``cpu-error`` (the CPU raises too: not counted); ``no-grad`` (backward: the sample
has no differentiable output or input: not counted).

Usage::

    python -m torchneuron.tools.op_coverage                # the fast subset, summary only
    python -m torchneuron.tools.op_coverage --full         # everything -> docs/op_coverage.md
    python -m torchneuron.tools.op_coverage --ops add,mm --out /tmp/report.md
    python -m torchneuron.tools.op_coverage --full --json run.json   # also every result
    python -m torchneuron.tools.op_coverage --full --from-json run.json  # re-render only

The sweep runs the samples in worker processes (``--jobs``) with a per-sample timeout, so
a crash or a hang of one sample is recorded against it and the sweep goes on. The report
names the commit and the build of the extension the workers ran (and says so if the backend
was rebuilt during the run). ``KNOWN_CAUSES`` maps the remaining failures to their causes.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import queue
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import types
import unittest
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int64": torch.int64,
    "bool": torch.bool,
}
FORWARD = "forward"
BACKWARD = "backward"
SEED = 1234

PASS, FAIL, ERROR, CPU_ERROR, NO_GRAD = "pass", "fail", "error", "cpu-error", "no-grad"
COUNTED = (PASS, FAIL, ERROR)

# How a passing sample was checked.
EXACT = "exact"  # bitwise equal (NaN == NaN)
CLOSE = "close"  # within assert_close's default tolerance
OVERRIDE = "override"  # within the OpInfo's own looser tolerance
METADATA = "metadata"  # random / undefined values: shape, dtype, layout, device only
UNREPRODUCIBLE = "unreproducible"  # the CPU result changes from run to run: metadata only

# Ops whose outputs are random (drawn from a generator) or undefined (uninitialised memory):
# their values are not compared, only shape, dtype, layout and device.
RANDOM_OPS: dict[str, str] = {
    **dict.fromkeys(
        (
            "bernoulli",
            "cauchy",
            "exponential",
            "geometric",
            "log_normal",
            "multinomial",
            "normal",
            "normal.in_place",
            "normal.number_mean",
            "uniform",
            "rand_like",
            "randint",
            "randint_like",
            "randn",
            "randn_like",
            "nn.functional.alpha_dropout",
            "nn.functional.dropout",
            "nn.functional.dropout2d",
            "nn.functional.dropout3d",
            "nn.functional.feature_alpha_dropout.with_train",
            "nn.functional.fractional_max_pool2d",
            "nn.functional.fractional_max_pool3d",
            "nn.functional.rrelu",
        ),
        "random values",
    ),
    **dict.fromkeys(
        (
            "empty",
            "empty_like",
            "empty_permuted",
            "empty_strided",
            "new_empty",
            "new_empty_strided",
            "resize_",
            "resize_as_",
        ),
        "uninitialised memory",
    ),
}

# Tensor arguments (positions in SampleInput.args) that PyTorch requires on the CPU whatever
# the device: the OpInfo creates them with torch.tensor() (no device), so a device's own test
# suite passes them on the CPU too. tensor_split: "tensor_indices_or_sections must be on cpu".
HOST_ARGUMENTS: dict[str, tuple[int, ...]] = {"tensor_split": (0,)}

# Causes of the non-passes the full sweep finds, each reproduced by hand: (op regex, reason
# regex, cause). The report groups failures by them; anything else shows as 'unexplained'.
# Entries for fixed bugs stay, so that a regression is named when it comes back.
KNOWN_CAUSES: list[tuple[str, str, str]] = [
    (
        r"native_layer_norm|nn\.functional\.layer_norm|native_group_norm|nn\.functional\.group_norm"
        r"|addr",
        r"",
        "backend bug (composite instead of CPU kernel; fixed in 180aff9): the op has both a "
        "CPU kernel and a CompositeExplicitAutograd kernel, and on neuron the composite "
        "(math_native_layer_norm, math_group_norm, math_addr) won over the host-kernel "
        "fallback, so bf16/f16 rounding (and, for empty inputs, the dtype of mean/rstd) "
        "differed from the CPU",
    ),
    (
        r"sgn",
        r"SIGSEGV",
        "backend bug (zero tensor crash; fixed in fb06dbd): "
        "torch._efficientzerotensor(..., device='neuron') crashed the process (a memcpy in "
        "ResultAdopter::move_into from the zero tensor's data-less storage); sgn's backward "
        "for real inputs returns a zero tensor",
    ),
    (
        r"fft\..*|polar|linalg\.eig|linalg\.eigvals",
        r"SIGSEGV",
        "backend bug (conjugate/negative views crash; fixed in fb06dbd): any op or copy on a "
        "conjugate or negative view of a neuron tensor recursed without end (conjugateFallback "
        "-> clone -> copy_ -> neuron _copy_from -> conjugateFallback) and crashed the process; "
        "fft.ifft/hfft/ihfft return conjugate views, polar and eig backward call conj()",
    ),
    (
        r".*",
        r"[Ss]parse",
        "not supported: sparse layouts on neuron (no sparse kernels are registered)",
    ),
    (
        r"nn\.functional\.scaled_dot_product_attention",
        r"not differentiable with respect to argument 'attn_mask'",
        "backend bug (SDPA kernel choice; fixed in 180aff9): neuron's _fused_sdp_choice asked "
        "the CPU chooser with host aliases, which drop requires_grad, so it picked the CPU "
        "flash kernel although attn_mask requires grad; that kernel cannot differentiate it",
    ),
    (
        r"nn\.functional\.linear_cross_entropy.*",
        r"",
        "PyTorch policy, not a backend bug: linear_cross_entropy resolves acc_policy='auto' "
        "per (device type, dtype); CPU bf16/f16 use 'accurate', devices without an entry "
        "(neuron) get the 'compact' fallback (torch/nn/modules/linear_cross_entropy_options.py); "
        "with acc_policy='accurate' passed explicitly neuron equals the CPU bitwise",
    ),
]

# The fast subset (tests/test_opinfo.py and the default of the CLI): ops Transformers-style
# models use, each with the dtypes it is checked in. float32 means forward and backward.
FAST_OPS: dict[str, tuple[str, ...]] = {
    # elementwise
    "add": ("float32", "bfloat16", "float16", "int64", "bool"),
    "mul": ("float32", "bfloat16", "int64", "bool"),
    "div.no_rounding_mode": ("float32", "bfloat16"),
    "pow": ("float32",),
    "exp": ("float32", "bfloat16"),
    "rsqrt": ("float32", "bfloat16"),
    "tanh": ("float32",),
    "sigmoid": ("float32",),
    "abs": ("float32", "int64"),
    "clamp": ("float32", "int64"),
    "where": ("float32", "bool"),
    "maximum": ("float32",),
    "cos": ("float32",),
    "erf": ("float32",),
    "eq": ("float32", "int64", "bool"),
    "logical_and": ("bool",),
    "bitwise_and": ("int64", "bool"),
    "masked_fill": ("float32", "bfloat16"),
    # reductions and scans
    "sum": ("float32", "bfloat16", "int64", "bool"),
    "mean": ("float32", "bfloat16"),
    "argmax": ("float32", "int64"),
    "var": ("float32",),
    "cumsum": ("float32", "int64"),
    "logsumexp": ("float32",),
    "all": ("bool",),
    "topk": ("float32",),
    # linear algebra
    "matmul": ("float32", "bfloat16", "float16"),
    "mm": ("float32",),
    "bmm": ("float32", "bfloat16"),
    "addmm": ("float32",),
    "baddbmm": ("float32",),
    "einsum": ("float32",),
    "linalg.vector_norm": ("float32",),
    "triu": ("float32", "bool"),
    # indexing
    "index_select": ("float32", "int64"),
    "gather": ("float32",),
    "scatter": ("float32",),
    "index_put": ("float32",),
    "__getitem__": ("float32", "int64"),
    "nonzero": ("float32", "bool"),
    "arange": ("float32", "int64"),
    # views and shape changes
    "view": ("float32", "bool"),
    "reshape": ("float32",),
    "transpose": ("float32",),
    "permute": ("float32",),
    "expand": ("float32",),
    "split": ("float32",),
    "cat": ("float32", "bfloat16", "float16", "int64", "bool"),
    "unsqueeze": ("float32",),
    "to": ("float32", "bfloat16"),
    # nn.functional used by transformers
    "nn.functional.linear": ("float32", "bfloat16"),
    "softmax": ("float32", "bfloat16", "float16"),
    "log_softmax": ("float32",),
    "nn.functional.layer_norm": ("float32", "bfloat16", "float16"),
    "nn.functional.rms_norm": ("float32", "bfloat16"),
    "nn.functional.embedding": ("float32", "bfloat16"),
    "nn.functional.gelu": ("float32", "bfloat16"),
    "nn.functional.silu": ("float32",),
    "nn.functional.relu": ("float32",),
    "nn.functional.cross_entropy": ("float32",),
    "nn.functional.scaled_dot_product_attention": ("float32",),
    "nn.functional.dropout": ("float32",),
    "nn.functional.conv2d": ("float32",),
    "nn.functional.pad.constant": ("float32",),
    "nn.functional.group_norm": ("float32",),
    "nn.functional.one_hot": ("int64",),
}


@dataclasses.dataclass
class Result:
    """The outcome of one sample of one (op, dtype, mode)."""

    op: str
    dtype: str
    mode: str
    index: int
    status: str
    reason: str = ""
    sample: str = ""
    checked: str = ""

    def line(self) -> str:
        text = f"{self.op} {self.dtype} {self.mode} #{self.index}: {self.status}"
        if self.reason:
            text += f" ({self.reason})"
        if self.sample:
            text += f" [sample: {self.sample}]"
        return text


@dataclasses.dataclass(frozen=True)
class Unit:
    """The samples of one op in one dtype and mode, run together."""

    op: str
    dtype: str
    mode: str


# ---------------------------------------------------------------------------------------------
# The op database


def _ensure_expecttest() -> None:
    """common_utils imports ``expecttest`` (a test-only dependency PyTorch does not install);
    the op database does not use it, so a stand-in module is enough when it is missing."""
    try:
        import expecttest  # noqa: F401
    except ImportError:
        stub = types.ModuleType("expecttest")
        stub.TestCase = unittest.TestCase  # type: ignore[attr-defined]
        stub.ACCEPT = False  # type: ignore[attr-defined]
        sys.modules["expecttest"] = stub


_OP_DB: list[Any] | None = None


def load_op_db() -> list[Any]:
    """PyTorch's OpInfo database (``op_db``)."""
    global _OP_DB
    if _OP_DB is None:
        _ensure_expecttest()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torch.testing._internal.common_methods_invocations import op_db
        _OP_DB = list(op_db)
    return _OP_DB


def op_key(op: Any) -> str:
    """``name`` or ``name.variant_test_name``: unique within op_db."""
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def ops_by_key() -> dict[str, Any]:
    return {op_key(op): op for op in load_op_db()}


def supported_dtypes(op: Any) -> list[str]:
    """The dtypes of DTYPES the op supports on the CPU."""
    cpu = op.supported_dtypes("cpu")
    return [name for name, dtype in DTYPES.items() if dtype in cpu]


def has_backward(op: Any) -> bool:
    return bool(op.supports_autograd) and torch.float32 in op.supported_backward_dtypes("cpu")


def units_for(op: Any, dtypes: Iterable[str] | None = None) -> list[Unit]:
    """The units of one op: forward per supported dtype, backward in float32."""
    wanted = set(dtypes) if dtypes is not None else set(DTYPES)
    units = []
    for name in supported_dtypes(op):
        if name not in wanted:
            continue
        units.append(Unit(op_key(op), name, FORWARD))
        if name == "float32" and has_backward(op):
            units.append(Unit(op_key(op), name, BACKWARD))
    return units


def tolerance_override(op: Any, dtype: torch.dtype) -> tuple[float, float] | None:
    """The loosest (rtol, atol) the OpInfo declares for `dtype` (CPU or any device)."""
    from torch.testing._internal.common_device_type import precisionOverride, toleranceOverride
    from torch.testing._internal.opinfo.core import DecorateInfo

    rtol = atol = None
    for info in op.decorators or ():
        decorators = [info]
        if isinstance(info, DecorateInfo):
            if info.device_type not in (None, "cpu") or not info.active_if:
                continue
            if info.dtypes is not None and dtype not in info.dtypes:
                continue
            decorators = info.decorators
        for decorator in decorators:
            if isinstance(decorator, toleranceOverride) and dtype in decorator.d:
                entry = decorator.d[dtype]
                rtol = max(rtol or 0.0, entry.rtol)
                atol = max(atol or 0.0, entry.atol)
            elif isinstance(decorator, precisionOverride) and dtype in decorator.d:
                atol = max(atol or 0.0, decorator.d[dtype])
                rtol = max(rtol or 0.0, 0.0)
    if rtol is None or atol is None:
        return None
    return rtol, atol


# ---------------------------------------------------------------------------------------------
# Moving samples between devices


def _copy_tensor(
    t: torch.Tensor, device: str, memo: dict[tuple[int, int], torch.Tensor]
) -> torch.Tensor:
    """A copy of `t` on `device` with the same sizes, strides and storage offset (the whole
    storage is copied, so views and overlapping strides come out the same, and tensors that
    share a storage on the CPU share one on `device`)."""
    plain = type(t) in (torch.Tensor, torch.nn.Parameter)
    if plain and t.layout == torch.strided and t.device.type == "cpu" and not t.is_conj():
        if t.is_neg():
            t = t.resolve_neg()
        storage = t.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key not in memo or key[0] == 0:
            raw = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))
            memo[key] = raw.to(device, copy=True)
        base = memo[key].view(t.dtype)
        out = base.as_strided(t.size(), t.stride(), t.storage_offset()).detach()
    else:
        out = t.detach().to(device, copy=True)
    if t.requires_grad:
        out.requires_grad_(True)
    return out


def transform(
    obj: Any, device: str, memo: dict[tuple[int, int], torch.Tensor] | None = None
) -> Any:
    """`obj` with every tensor copied to `device` (recursively through lists, tuples and
    dicts); CPU devices (torch.device or the string ``"cpu"``) and CPU generators follow."""
    memo = {} if memo is None else memo
    if isinstance(obj, torch.Tensor):
        return _copy_tensor(obj, device, memo)
    if isinstance(obj, torch.Size):
        return obj
    if isinstance(obj, torch.device):
        return torch.device(device) if obj.type == "cpu" else obj
    if isinstance(obj, str) and (obj == "cpu" or obj.startswith("cpu:")):
        return device  # a device argument given as a string (``to('cpu')``, ``device='cpu'``)
    if isinstance(obj, torch.Generator):
        generator = torch.Generator(device=device)
        generator.manual_seed(obj.initial_seed())
        return generator
    if isinstance(obj, list):
        return [transform(x, device, memo) for x in obj]
    if isinstance(obj, tuple):
        items = [transform(x, device, memo) for x in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    if isinstance(obj, dict):
        return {k: transform(v, device, memo) for k, v in obj.items()}
    return obj


def neuron_copy(op: Any, sample: Any) -> tuple[Any, Any, Any]:
    """(input, args, kwargs) of `sample` on neuron; arguments of HOST_ARGUMENTS stay on the
    CPU (as copies), as in PyTorch's own device tests."""
    sample_input, args, kwargs = transform((sample.input, sample.args, sample.kwargs), "neuron")
    host = HOST_ARGUMENTS.get(op_key(op), ())
    if host:
        args = tuple(
            transform(a, "cpu") if i in host and isinstance(a, torch.Tensor) else n
            for i, (a, n) in enumerate(zip(sample.args, args, strict=True))
        )
    return sample_input, args, kwargs


def _flatten(obj: Any) -> list[Any]:
    """The leaves of `obj` in order (through lists, tuples and dicts; torch.Size is a leaf)."""
    if isinstance(obj, (list, tuple)) and not isinstance(obj, torch.Size):
        return [leaf for x in obj for leaf in _flatten(x)]
    if isinstance(obj, dict):
        return [leaf for k in obj for leaf in _flatten(obj[k])]
    return [obj]


def _tensors(obj: Any) -> list[torch.Tensor]:
    return [x for x in _flatten(obj) if isinstance(x, torch.Tensor)]


_SHORT_DTYPE = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.bfloat16: "bf16",
    torch.float16: "f16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "b8",
    torch.complex64: "c64",
}


def _describe(obj: Any) -> str:
    if isinstance(obj, torch.Tensor):
        text = f"{_SHORT_DTYPE.get(obj.dtype, str(obj.dtype))}{list(obj.shape)}"
        if obj.layout != torch.strided:
            text += f"({obj.layout})"
        elif not obj.is_contiguous():
            text += f"(strides {list(obj.stride())})"
        return text.replace(" ", "")
    if isinstance(obj, (list, tuple)) and not isinstance(obj, torch.Size):
        inner = ", ".join(_describe(x) for x in obj)
        return f"[{inner}]" if isinstance(obj, list) else f"({inner})"
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{k}={_describe(v)}" for k, v in obj.items()) + "}"
    if callable(obj) and not isinstance(obj, torch.dtype):
        return getattr(obj, "__name__", type(obj).__name__)
    return repr(obj)


def describe_sample(sample: Any) -> str:
    """A short text of a SampleInput: dtypes and shapes of the tensors, other values."""
    parts = [_describe(sample.input)]
    parts += [_describe(a) for a in sample.args]
    parts += [f"{k}={_describe(v)}" for k, v in sample.kwargs.items()]
    text = ", ".join(parts)
    return text if len(text) <= 200 else text[:197] + "..."


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    text = f"{type(error).__name__}: {lines[0] if lines else ''}"
    return text if len(text) <= 240 else text[:237] + "..."


# ---------------------------------------------------------------------------------------------
# Comparing results


class Mismatch(Exception):
    """A difference between the neuron and the CPU result."""


def _check_close(
    actual: torch.Tensor, expected: torch.Tensor, rtol: float | None, atol: float | None
) -> None:
    try:
        torch.testing.assert_close(
            actual, expected, rtol=rtol, atol=atol, equal_nan=True, check_stride=False
        )
    except AssertionError as error:
        summary = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
        raise Mismatch(summary[:300]) from None


def _compare(actual: Any, expected: Any, level: str, path: str) -> None:
    """Raises Mismatch when `actual` (neuron) differs from `expected` (CPU) at `level`:
    EXACT (bitwise), CLOSE (default tolerances), (rtol, atol), or METADATA."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            raise Mismatch(f"{path}: expected a tensor, got {type(actual).__name__}")
        if actual.device.type != "neuron":
            raise Mismatch(f"{path}: on {actual.device}, expected a neuron tensor")
        if actual.dtype != expected.dtype or actual.shape != expected.shape:
            raise Mismatch(
                f"{path}: {actual.dtype}{list(actual.shape)} on neuron, "
                f"{expected.dtype}{list(expected.shape)} on cpu"
            )
        if actual.layout != expected.layout:
            raise Mismatch(f"{path}: layout {actual.layout} on neuron, {expected.layout} on cpu")
        if level == METADATA:
            return
        host = actual.detach().cpu()
        expected = expected.detach()
        if level == EXACT:
            _check_close(host, expected, 0.0, 0.0)
        elif level == CLOSE:
            _check_close(host, expected, None, None)
        else:
            rtol, atol = level  # type: ignore[misc]
            _check_close(host, expected, rtol, atol)
        return
    if isinstance(expected, (list, tuple)) and not isinstance(expected, torch.Size):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            raise Mismatch(f"{path}: {_describe(actual)} on neuron, {_describe(expected)} on cpu")
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            _compare(a, e, level, f"{path}[{i}]")
        return
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(actual) != set(expected):
            raise Mismatch(f"{path}: {_describe(actual)} on neuron, {_describe(expected)} on cpu")
        for k in expected:
            _compare(actual[k], expected[k], level, f"{path}[{k!r}]")
        return
    if level == METADATA:
        if type(actual) is not type(expected):
            raise Mismatch(f"{path}: {type(actual).__name__} on neuron, {type(expected).__name__}")
        return
    if isinstance(expected, float) and isinstance(actual, float):
        if math.isnan(expected) and math.isnan(actual):
            return
        if level == EXACT:
            ok = actual == expected
        else:
            rtol, atol = (1.3e-6, 1e-5) if level == CLOSE else level  # type: ignore[misc]
            ok = math.isclose(actual, expected, rel_tol=rtol, abs_tol=atol)
        if not ok:
            raise Mismatch(f"{path}: {actual!r} on neuron, {expected!r} on cpu")
        return
    if type(actual) is not type(expected) or actual != expected:
        raise Mismatch(f"{path}: {actual!r} on neuron, {expected!r} on cpu")


def _compare_levels(actual: Any, expected: Any, op: Any, dtype: torch.dtype, random: bool) -> str:
    """The level at which `actual` matches `expected` (EXACT, CLOSE, OVERRIDE, METADATA);
    raises Mismatch (the default-tolerance one) when none does."""
    if random:
        _compare(actual, expected, METADATA, "output")
        return METADATA
    try:
        _compare(actual, expected, EXACT, "output")
        return EXACT
    except Mismatch:
        pass
    try:
        _compare(actual, expected, CLOSE, "output")
        return CLOSE
    except Mismatch as error:
        override = tolerance_override(op, dtype)
        if override is None:
            raise
        try:
            _compare(actual, expected, override, "output")
        except Mismatch:
            raise error from None
        return OVERRIDE


def _storage_key(t: torch.Tensor) -> int | None:
    if t.layout != torch.strided or type(t) not in (torch.Tensor, torch.nn.Parameter):
        return None
    try:
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    return storage.data_ptr() if storage.nbytes() > 0 else None


def _check_aliasing(
    cpu_out: Any, neuron_out: Any, cpu_inputs: list[torch.Tensor], neuron_inputs: list[torch.Tensor]
) -> None:
    """An output that shares memory with an input on the CPU must share memory with the same
    input on neuron (views and in-place results), and only then."""
    cpu_keys = [_storage_key(t) for t in cpu_inputs]
    neuron_keys = [_storage_key(t) for t in neuron_inputs]
    cpu_outs, neuron_outs = _flatten(cpu_out), _flatten(neuron_out)
    for i, (c, n) in enumerate(zip(cpu_outs, neuron_outs, strict=False)):
        if not isinstance(c, torch.Tensor) or not isinstance(n, torch.Tensor):
            continue
        c_key, n_key = _storage_key(c), _storage_key(n)
        if c_key is None or n_key is None:
            continue
        c_alias = [j for j, k in enumerate(cpu_keys) if k == c_key]
        n_alias = [j for j, k in enumerate(neuron_keys) if k == n_key]
        if c_alias != n_alias:
            where = f"output[{i}]" if len(cpu_outs) > 1 else "output"
            if c_alias and not n_alias:
                raise Mismatch(f"{where} is a view of an input on cpu but a new tensor on neuron")
            if n_alias and not c_alias:
                raise Mismatch(
                    f"{where} is a new tensor on cpu but shares an input's memory on neuron"
                )
            raise Mismatch(f"{where} aliases inputs {c_alias} on cpu but {n_alias} on neuron")


# ---------------------------------------------------------------------------------------------
# Running samples


def _seed(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    with contextlib.suppress(ImportError):
        import numpy

        numpy.random.seed(seed)


def generate_samples(op: Any, dtype: str, mode: str) -> list[Any]:
    """The OpInfo's sample inputs on the CPU, generated from a fixed seed (reproducible, so a
    restarted worker regenerates the same list)."""
    _seed(SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return list(op.sample_inputs("cpu", DTYPES[dtype], requires_grad=mode == BACKWARD))


def _call(op: Any, sample_input: Any, args: Any, kwargs: Any, post: Callable[[Any], Any]) -> Any:
    return post(op(sample_input, *args, **kwargs))


def _default_device(neuron_sample: Any) -> contextlib.AbstractContextManager[Any]:
    """Factory samples without any tensor (``arange(5)``) create their result on the default
    device: make that neuron for the neuron run, as a device's own test suite does."""
    return torch.device("neuron") if not _tensors(neuron_sample) else contextlib.nullcontext()


def _differentiable(outputs: Any) -> list[torch.Tensor]:
    return [
        t
        for t in _tensors(outputs)
        if t.requires_grad and (t.dtype.is_floating_point or t.dtype.is_complex)
    ]


def _run_forward(
    op: Any, sample: Any, dtype: torch.dtype, random: bool, phase: Callable[[str], None]
) -> str:
    """Runs one forward sample on both devices; returns how it passed, raises Mismatch,
    _NeuronError or _CpuError."""
    post = sample.output_process_fn_grad
    neuron_sample = neuron_copy(op, sample)
    pristine = transform((sample.input, sample.args, sample.kwargs), "cpu")
    phase("cpu")
    _seed(SEED)
    try:
        expected = _call(op, sample.input, sample.args, sample.kwargs, post)
    except Exception as error:
        raise _CpuError(_first_line(error)) from error
    phase("neuron")
    _seed(SEED)
    try:
        with _default_device(neuron_sample):
            actual = _call(op, *neuron_sample, post)
    except Exception as error:
        raise _NeuronError(_first_line(error)) from error
    phase("compare")
    cpu_inputs = _tensors((sample.input, sample.args, sample.kwargs))
    neuron_inputs = _tensors(neuron_sample)
    try:
        level = _compare_levels(actual, expected, op, dtype, random)
        _check_aliasing(expected, actual, cpu_inputs, neuron_inputs)
        # Inputs the op writes to (in-place ops, out-like arguments) must agree afterwards.
        for i, (n, c) in enumerate(zip(neuron_inputs, cpu_inputs, strict=True)):
            if n.device.type != "neuron":  # HOST_ARGUMENTS
                continue
            try:
                _compare_levels(n, c, op, dtype, random)
            except Mismatch as error:
                raise Mismatch(f"input {i} after the call: {error}") from None
        return level
    except Mismatch:
        if random or not _cpu_unreproducible(op, pristine, post, expected):
            raise
        _compare(actual, expected, METADATA, "output")
        return UNREPRODUCIBLE


def _cpu_unreproducible(op: Any, pristine: Any, post: Callable[[Any], Any], expected: Any) -> bool:
    """True when the CPU gives another result for the same inputs under another seed."""
    _seed(SEED + 1)
    try:
        again = _call(op, *pristine, post)
        _compare_cpu(again, expected)
    except Mismatch:
        return True
    except Exception:
        return False
    return False


def _compare_cpu(actual: Any, expected: Any) -> None:
    a, e = _flatten(actual), _flatten(expected)
    if len(a) != len(e):
        raise Mismatch("structure")
    for x, y in zip(a, e, strict=True):
        if isinstance(y, torch.Tensor):
            if not isinstance(x, torch.Tensor) or x.shape != y.shape or x.dtype != y.dtype:
                raise Mismatch("metadata")
            _check_close(x.detach(), y.detach(), None, None)


def _run_backward(op: Any, sample: Any, random: bool, phase: Callable[[str], None]) -> str:
    """Runs one sample forward and backward (autograd.grad of the outputs with a fixed random
    cotangent) on both devices and compares the input gradients."""
    post = sample.output_process_fn_grad
    neuron_sample = neuron_copy(op, sample)
    phase("cpu")
    cpu_inputs = [
        t for t in _tensors((sample.input, sample.args, sample.kwargs)) if t.requires_grad
    ]
    if not cpu_inputs:
        raise _NoGrad("no input requires grad")
    _seed(SEED)
    try:
        cpu_out = _differentiable(_call(op, sample.input, sample.args, sample.kwargs, post))
        if not cpu_out:
            raise _NoGrad("no differentiable output")
        generator = torch.Generator().manual_seed(SEED)
        cotangents = [torch.randn(t.shape, generator=generator, dtype=t.dtype) for t in cpu_out]
        expected = torch.autograd.grad(cpu_out, cpu_inputs, cotangents, allow_unused=True)
    except _NoGrad:
        raise
    except Exception as error:
        raise _CpuError(_first_line(error)) from error
    phase("neuron")
    neuron_inputs = [t for t in _tensors(neuron_sample) if t.requires_grad]
    _seed(SEED)
    try:
        with _default_device(neuron_sample):
            neuron_out = _differentiable(_call(op, *neuron_sample, post))
        if len(neuron_out) != len(cpu_out):
            raise Mismatch(
                f"{len(neuron_out)} differentiable outputs on neuron, {len(cpu_out)} on cpu"
            )
        neuron_cotangents = [c.to("neuron") for c in cotangents]
        actual = torch.autograd.grad(
            neuron_out, neuron_inputs, neuron_cotangents, allow_unused=True
        )
    except Mismatch:
        raise
    except Exception as error:
        raise _NeuronError(_first_line(error)) from error
    phase("compare")
    try:
        return _compare_levels(list(actual), list(expected), op, torch.float32, random)
    except Mismatch as error:
        raise Mismatch(str(error).replace("output", "grad", 1)) from None


class _CpuError(Exception):
    pass


class _NeuronError(Exception):
    pass


class _NoGrad(Exception):
    pass


def run_sample(
    op: Any,
    sample: Any,
    dtype: str,
    mode: str,
    index: int,
    phase: Callable[[str], None] | None = None,
) -> Result:
    """Runs one sample of `op` on CPU and neuron and classifies it."""
    key = op_key(op)
    result = Result(key, dtype, mode, index, PASS, sample=describe_sample(sample))
    random = key in RANDOM_OPS
    phase = phase or (lambda _: None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            if mode == FORWARD:
                result.checked = _run_forward(op, sample, DTYPES[dtype], random, phase)
            else:
                result.checked = _run_backward(op, sample, random, phase)
        except Mismatch as error:
            result.status, result.reason = FAIL, str(error)
        except _NeuronError as error:
            result.status, result.reason = ERROR, str(error)
        except _CpuError as error:
            result.status, result.reason = CPU_ERROR, str(error)
        except _NoGrad as error:
            result.status, result.reason = NO_GRAD, str(error)
        except Exception as error:  # a bug in the comparison itself: report it, do not hide it
            result.status, result.reason = ERROR, "harness: " + _first_line(error)
    if result.checked == UNREPRODUCIBLE:
        result.reason = "CPU result differs between runs: compared shape/dtype/device only"
    elif result.checked == METADATA:
        result.reason = f"{RANDOM_OPS[key]}: compared shape/dtype/device only"
    return result


def check_unit(
    unit: Unit, start: int = 0, phase: Callable[[int, str], None] | None = None
) -> Iterator[Result]:
    """Runs the samples of `unit` (from index `start`) in this process."""
    op = ops_by_key()[unit.op]
    try:
        samples = generate_samples(op, unit.dtype, unit.mode)
    except Exception as error:
        yield Result(
            unit.op,
            unit.dtype,
            unit.mode,
            -1,
            CPU_ERROR,
            "sample generation: " + _first_line(error),
        )
        return
    for index in range(start, len(samples)):
        callback = (lambda p, i=index: phase(i, p)) if phase else None
        yield run_sample(op, samples[index], unit.dtype, unit.mode, index, callback)


def check_op(key: str, dtype: str, mode: str) -> list[Result]:
    """All samples of one op in one dtype and mode, in this process (for pytest)."""
    return list(check_unit(Unit(key, dtype, mode)))


# ---------------------------------------------------------------------------------------------
# Worker processes (a crash or hang costs one sample, not the sweep)


def build_id() -> str:
    """Which build of the backend this process runs: the extension's file and its mtime."""
    from torchneuron import _C

    path = Path(_C.__file__)
    built = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(path.stat().st_mtime))
    return f"{path.name} built {built} UTC"


def source_state() -> str:
    """The git commit of the checkout and whether csrc/ has uncommitted changes."""
    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--", "csrc")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if not head:
        return "unknown"
    return f"commit {head}" + (" with uncommitted changes in csrc/" if dirty else "")


def _worker_main() -> None:
    """Reads units (JSON lines) on stdin; writes progress and results on the original stdout.
    Anything else the ops print goes to stderr."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    load_op_db()

    def send(message: dict[str, Any]) -> None:
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    send({"t": "ready", "build": build_id()})
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        unit = Unit(request["op"], request["dtype"], request["mode"])
        for result in check_unit(
            unit, request["start"], lambda i, p: send({"t": "p", "i": i, "p": p})
        ):
            send({"t": "r", "r": dataclasses.asdict(result)})
        send({"t": "end"})


class _Process:
    """One worker process: its pipes, a thread reading its messages, and its stderr log."""

    command = [sys.executable, "-m", "torchneuron.tools.op_coverage", "--worker"]

    def __init__(self) -> None:
        self.log = tempfile.NamedTemporaryFile(
            prefix="op_coverage_worker_", suffix=".log", delete=False
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.ready = False
        self.build = "unknown"
        self.popen = subprocess.Popen(
            self.command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            bufsize=1,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next(self, timeout: float) -> dict[str, Any] | None:
        """The next message; None on EOF; raises TimeoutError."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError from None
        return None if line is None else json.loads(line)

    def wait_ready(self, timeout: float) -> None:
        if not self.ready:
            message = self.next(timeout)
            if message is None or message.get("t") != "ready":
                raise RuntimeError(f"op_coverage worker did not start: {self.stderr_tail()}")
            self.ready = True
            self.build = str(message.get("build", "unknown"))

    def send(self, message: dict[str, Any]) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(json.dumps(message) + "\n")
        self.popen.stdin.flush()

    def stderr_tail(self) -> str:
        try:
            text = Path(self.log.name).read_text(errors="replace")
        except OSError:
            return ""
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return lines[-1][:200] if lines else ""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def close(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()
        self.log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log.name)


class _Worker:
    """Runs units in a worker process, replaced after a crash or a timeout. After the first
    replacement a spare process is kept loading in the background, so a run of crashing
    samples does not wait for a fresh interpreter each time."""

    def __init__(self, timeout: float, builds: set[str] | None = None) -> None:
        self.timeout = timeout
        self.process: _Process | None = None
        self.spare: _Process | None = None
        self.replacements = 0
        self.builds = builds if builds is not None else set()

    def _start(self) -> None:
        if self.process is not None:
            self.process.close()
            self.replacements += 1
        self.process, self.spare = self.spare or _Process(), None
        self.process.wait_ready(max(self.timeout, 300.0))
        self.builds.add(self.process.build)
        if self.replacements:
            self.spare = _Process()

    def close(self) -> None:
        for process in (self.process, self.spare):
            if process is not None:
                process.close()
        self.process = self.spare = None

    def run(self, unit: Unit) -> list[Result]:
        results: list[Result] = []
        start = 0
        while True:
            if self.process is None or not self.process.alive():
                self._start()
            assert self.process is not None
            process = self.process
            process.send({"op": unit.op, "dtype": unit.dtype, "mode": unit.mode, "start": start})
            index, current_phase = start, "generate"
            try:
                while True:
                    message = process.next(self.timeout)
                    if message is None:
                        code = process.popen.wait()
                        how = signal.Signals(-code).name if code < 0 else f"exit code {code}"
                        tail = process.stderr_tail()
                        tail = f": {tail}" if tail else ""
                        raise _WorkerDied(f"crashed ({how}) during {current_phase}{tail}")
                    if message["t"] == "p":
                        index, current_phase = message["i"], message["p"]
                    elif message["t"] == "r":
                        results.append(Result(**message["r"]))
                        index, current_phase = message["r"]["index"] + 1, "next"
                    elif message["t"] == "end":
                        return results
            except TimeoutError:
                process.popen.kill()
                process.popen.wait()
                reason = f"timeout: no result after {self.timeout:.0f} s (during {current_phase})"
            except _WorkerDied as died:
                reason = str(died)
            if current_phase in ("generate", "next"):
                # Sample generation itself died: record the unit and move on.
                status = CPU_ERROR if current_phase == "generate" else ERROR
                results.append(
                    Result(
                        unit.op,
                        unit.dtype,
                        unit.mode,
                        index if current_phase == "next" else -1,
                        status,
                        "worker " + reason,
                    )
                )
                if current_phase == "generate":
                    return results
            else:
                status = CPU_ERROR if current_phase == "cpu" else ERROR
                results.append(
                    Result(unit.op, unit.dtype, unit.mode, index, status, "worker " + reason)
                )
            start = index + 1


class _WorkerDied(Exception):
    pass


def sweep(
    units: list[Unit],
    jobs: int = 1,
    timeout: float = 180.0,
    verbose: bool = True,
    builds: set[str] | None = None,
) -> list[Result]:
    """Runs `units` in `jobs` worker processes; returns every sample's result. The builds of
    the backend the workers ran are added to `builds`."""
    pending: queue.Queue[tuple[int, Unit]] = queue.Queue()
    for item in enumerate(units):
        pending.put(item)
    collected: dict[int, list[Result]] = {}
    lock = threading.Lock()
    started = time.monotonic()

    def work() -> None:
        worker = _Worker(timeout, builds)
        try:
            while True:
                try:
                    number, unit = pending.get_nowait()
                except queue.Empty:
                    return
                results = worker.run(unit)
                with lock:
                    collected[number] = results
                    if verbose:
                        counts = Counter(r.status for r in results)
                        text = " ".join(f"{k}={v}" for k, v in sorted(counts.items()))
                        elapsed = time.monotonic() - started
                        print(
                            f"[{len(collected)}/{len(units)} {elapsed:.0f}s] "
                            f"{unit.op} {unit.dtype} {unit.mode}: {text}",
                            file=sys.stderr,
                            flush=True,
                        )
        finally:
            worker.close()

    threads = [threading.Thread(target=work) for _ in range(max(1, jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [r for number in sorted(collected) for r in collected[number]]


# ---------------------------------------------------------------------------------------------
# The report


def _counts(results: Iterable[Result]) -> Counter[str]:
    return Counter(r.status for r in results)


def _percent(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.2f}%" if whole else "n/a"


def summarize(results: list[Result]) -> dict[str, dict[str, int]]:
    """Status counts per mode and overall."""
    table: dict[str, dict[str, int]] = {}
    for mode in (FORWARD, BACKWARD):
        table[mode] = dict(_counts(r for r in results if r.mode == mode))
    table["all"] = dict(_counts(results))
    return table


def _summary_rows(results: list[Result]) -> list[str]:
    rows = [
        "| | samples run on CPU | pass | fail | error | pass rate | target 99% |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for label, mode in (
        ("forward", FORWARD),
        ("backward (float32 grads)", BACKWARD),
        ("all", None),
    ):
        counts = _counts(r for r in results if mode is None or r.mode == mode)
        counted = sum(counts[s] for s in COUNTED)
        rate = counts[PASS] / counted if counted else 0.0
        met = "met" if rate >= 0.99 else f"missed by {100 * (0.99 - rate):.2f} points"
        met = met if counted else "n/a"
        rows.append(
            f"| {label} | {counted} | {counts[PASS]} | {counts[FAIL]} | {counts[ERROR]} | "
            f"{_percent(counts[PASS], counted)} | {met} |"
        )
    return rows


def _matches(r: Result, op_pattern: str, reason_pattern: str) -> bool:
    return bool(re.fullmatch(op_pattern, r.op)) and bool(re.search(reason_pattern, r.reason))


def cause_of(r: Result) -> str:
    """The known cause of a non-pass, or 'unexplained: <reason>'."""
    for op_pattern, reason_pattern, cause in KNOWN_CAUSES:
        if _matches(r, op_pattern, reason_pattern):
            return cause
    return "unexplained: " + _reason_group(r)


def _reason_group(r: Result) -> str:
    """The reason of a non-pass without the details that differ from sample to sample."""
    text = r.reason
    if r.status == FAIL:
        text = re.sub(r"^(output|grad|input \d+ after the call: output)(\[[^\]]*\])*: ", "", text)
        if "not close" in text:
            return "fail: values differ beyond tolerance"
        if "not equal" in text:
            return "fail: values differ (exact dtype)"
    text = re.sub(r"\d+", "N", text)
    return f"{r.status}: {text[:140]}"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ").replace("`", "'")


def write_report(
    results: list[Result],
    units: list[Unit],
    path: Path | None,
    command: str,
    elapsed: float,
    full: bool = False,
    backend: str = "unknown",
) -> str:
    """Writes the markdown report (to `path` if given) and returns it."""
    ops = ops_by_key()
    by_cell: dict[tuple[str, str, str], list[Result]] = defaultdict(list)
    for r in results:
        by_cell[(r.op, r.dtype, r.mode)].append(r)
    op_names = list(dict.fromkeys(u.op for u in units))
    unit_set = set(units)
    checked = Counter(r.checked for r in results if r.status == PASS)
    counts = _counts(results)

    out: list[str] = []
    out.append("# OpInfo conformance of `neuron` against the CPU")
    out.append("")
    out.append(
        f"Generated by `{command}` (torchneuron/tools/op_coverage.py) with torch "
        f"{torch.__version__}, {len(op_names)} OpInfos of `op_db`, {len(units)} (op, dtype, mode) "
        f"units, in {elapsed / 60:.1f} min. Do not edit by hand; rerun the command."
    )
    out.append("")
    out.append(f"Backend under test: {backend}.")
    out.append("")
    out.append("## Summary")
    out.append("")
    out.extend(_summary_rows(results))
    out.append("")
    out.append(
        f"Of the passing samples, {checked[EXACT]} are bitwise equal to the CPU, {checked[CLOSE]} "
        f"within `assert_close`'s default tolerance, {checked[OVERRIDE]} within the OpInfo's own "
        f"declared tolerance; {checked[METADATA]} (random or uninitialised values) and "
        f"{checked[UNREPRODUCIBLE]} (CPU result not reproducible from run to run) were compared "
        f"by shape, dtype, layout and device only. Not counted: {counts[CPU_ERROR]} samples that "
        f"raise on the CPU too (`cpu-error`) and {counts[NO_GRAD]} backward samples with no "
        f"differentiable output or input (`no-grad`)."
    )
    out.append("")
    out.append("## Method")
    out.append("")
    out.append(
        "- Ops and samples: every OpInfo of `torch.testing._internal.common_methods_invocations."
        "op_db`; for each of float32, bfloat16, float16, int64, bool that "
        "`opinfo.supported_dtypes('cpu')` contains, `opinfo.sample_inputs('cpu', dtype)` "
        f"(generated from seed {SEED}). Each sample is copied to `neuron` with the same sizes, "
        "strides and storage offset, then `opinfo(input, *args, **kwargs)` runs on both (the "
        "global seed reset to the same value before each run); `output_process_fn_grad` is "
        "applied to both results."
    )
    out.append(
        "- Forward: the outputs must be neuron tensors and match the CPU's; inputs must match "
        "after the call (in-place writes); an output that is a view of an input on the CPU must "
        "be one on `neuron` (and the reverse)."
    )
    out.append(
        "- Backward (float32, ops with `supports_autograd`): samples with `requires_grad=True`; "
        "`torch.autograd.grad` of the differentiable outputs with a fixed random cotangent "
        "(normal, seed fixed) on both devices; the input gradients are compared."
    )
    out.append(
        "- Tolerance: `torch.testing.assert_close` defaults for the output's dtype (float32 "
        "rtol 1.3e-6 atol 1e-5; bfloat16 rtol 1.6e-2 atol 1e-5; float16 rtol 1e-3 atol 1e-5; "
        "integers and bool exact), `equal_nan=True`, strides not compared. A sample outside "
        "them passes if the OpInfo declares a looser `toleranceOverride`/`precisionOverride` "
        "for the dtype (counted above as 'OpInfo's own tolerance')."
    )
    random_keys = sorted(k for k in RANDOM_OPS if k in ops)
    out.append(
        "- Not compared by value (shape, dtype, layout and device only): random ops "
        + ", ".join(f"`{k}`" for k in random_keys if RANDOM_OPS[k] == "random values")
        + "; ops returning uninitialised memory "
        + ", ".join(f"`{k}`" for k in random_keys if RANDOM_OPS[k] != "random values")
        + "; and any sample whose CPU result changes when the CPU runs it again with another "
        "seed (listed below)."
    )
    out.append(
        "- Each sample runs in a worker process with a timeout; a crash or a timeout is an "
        "`error` of that sample. `cpu-error` and `no-grad` samples are not counted."
    )
    out.append("")

    non_pass = [r for r in results if r.status in (FAIL, ERROR)]
    out.append(f"## Failures and errors ({len(non_pass)})")
    out.append("")
    if not non_pass:
        out.append("None.")
    else:
        out.append("### By cause")
        out.append("")
        out.append(
            "Causes come from `KNOWN_CAUSES` in the harness (each was reproduced by hand); a "
            "non-pass that matches none is listed as 'unexplained' with its reason."
        )
        out.append("")
        out.append("| cause | samples | ops (dtype mode) |")
        out.append("|---|---:|---|")
        by_cause: dict[str, list[Result]] = defaultdict(list)
        for r in non_pass:
            by_cause[cause_of(r)].append(r)
        for cause, rs in sorted(by_cause.items(), key=lambda kv: -len(kv[1])):
            names = ", ".join(sorted({f"{r.op} ({r.dtype} {r.mode})" for r in rs}))
            out.append(f"| {_md(cause)} | {len(rs)} | {_md(names)} |")
        out.append("")
        out.append("### Every failing sample")
        out.append("")
        for r in non_pass:
            known = next((c for o, x, c in KNOWN_CAUSES if _matches(r, o, x)), None)
            label = f" [{known.split(':')[0]}]" if known else ""
            out.append(
                f"- `{r.op}` {r.dtype} {r.mode} sample {r.index}: **{r.status}**{label}: "
                f"{_md(r.reason)}" + (f" — sample: `{_md(r.sample)}`" if r.sample else "")
            )
    out.append("")

    unreproducible = [r for r in results if r.checked == UNREPRODUCIBLE]
    out.append(f"## Compared by metadata only: CPU not reproducible ({len(unreproducible)})")
    out.append("")
    if not unreproducible:
        out.append("None.")
    for r in unreproducible:
        out.append(f"- `{r.op}` {r.dtype} {r.mode} sample {r.index}: `{_md(r.sample)}`")
    out.append("")

    out.append("## Per op and dtype")
    out.append("")
    out.append(
        "Cells: pass/fail/error samples; `+N cpu` samples that raise on the CPU too (not "
        "counted); `—` dtype not supported on the CPU; `(m)` values not compared (random or "
        "uninitialised)."
    )
    out.append("")
    columns = [(d, FORWARD) for d in DTYPES] + [("float32", BACKWARD)]
    header = (
        "| op | " + " | ".join(d if m == FORWARD else "float32 grad" for d, m in columns) + " |"
    )
    out.append(header)
    out.append("|---|" + "---|" * len(columns))
    for key in op_names:
        cells = []
        for dtype, mode in columns:
            if Unit(key, dtype, mode) not in unit_set:
                cells.append("—")
                continue
            rs = by_cell.get((key, dtype, mode), [])
            c = _counts(rs)
            cell = f"{c[PASS]}/{c[FAIL]}/{c[ERROR]}"
            if c[FAIL] or c[ERROR]:
                cell = f"**{cell}**"
            if c[CPU_ERROR]:
                cell += f" +{c[CPU_ERROR]} cpu"
            if c[NO_GRAD]:
                cell += f" +{c[NO_GRAD]} no-grad"
            if key in RANDOM_OPS:
                cell += " (m)"
            cells.append(cell)
        out.append(f"| `{_md(key)}` | " + " | ".join(cells) + " |")
    out.append("")

    if full:
        not_run = [k for k in ops if k not in set(op_names)]
        out.append(f"## OpInfos not run: none of the five dtypes on the CPU ({len(not_run)})")
        out.append("")
        for key in not_run:
            cpu = sorted(str(d).replace("torch.", "") for d in ops[key].supported_dtypes("cpu"))
            out.append(f"- `{key}`: CPU dtypes {', '.join(cpu) if cpu else 'none'}")
        out.append("")

    cpu_errors = [r for r in results if r.status in (CPU_ERROR, NO_GRAD)]
    out.append(
        f"## Not counted: samples that raise on the CPU, backward without grads ({len(cpu_errors)})"
    )
    out.append("")
    grouped_cpu: dict[str, list[Result]] = defaultdict(list)
    for r in cpu_errors:
        grouped_cpu[f"{r.status}: {r.reason[:120]}"].append(r)
    if grouped_cpu:
        out.append("| reason | samples | ops |")
        out.append("|---|---:|---|")
        for reason, rs in sorted(grouped_cpu.items(), key=lambda kv: -len(kv[1])):
            names = ", ".join(sorted({f"{r.op} ({r.dtype} {r.mode})" for r in rs}))
            out.append(f"| {_md(reason)} | {len(rs)} | {_md(names)} |")
    else:
        out.append("None.")
    out.append("")
    text = "\n".join(out)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return text


# ---------------------------------------------------------------------------------------------
# Command line


def select_units(full: bool, ops: list[str] | None, dtypes: list[str] | None) -> list[Unit]:
    table = ops_by_key()
    if ops:
        unknown = [k for k in ops if k not in table]
        if unknown:
            raise SystemExit(f"unknown OpInfo(s): {', '.join(unknown)}")
        return [u for k in ops for u in units_for(table[k], dtypes)]
    if full:
        return [u for op in load_op_db() for u in units_for(op, dtypes)]
    units = []
    for key, wanted in FAST_OPS.items():
        units += units_for(table[key], [d for d in wanted if dtypes is None or d in dtypes])
    return units


def _default_report_path() -> Path:
    root = Path(__file__).resolve().parents[2]
    return (
        (root / "docs" / "op_coverage.md") if (root / "docs").is_dir() else Path("op_coverage.md")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m torchneuron.tools.op_coverage",
        description="Run PyTorch's OpInfo samples on neuron and on the CPU and compare.",
    )
    parser.add_argument(
        "--full", action="store_true", help="every OpInfo (default: the fast subset)"
    )
    parser.add_argument("--ops", help="comma-separated OpInfo names (name or name.variant)")
    parser.add_argument("--dtypes", help=f"comma-separated subset of {','.join(DTYPES)}")
    parser.add_argument("--out", type=Path, help="markdown report (--full: docs/op_coverage.md)")
    parser.add_argument("--json", type=Path, help="also write every sample's result as JSON")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per sample")
    parser.add_argument("--in-process", action="store_true", help="no workers (debugging)")
    parser.add_argument(
        "--from-json",
        type=Path,
        help="rewrite the report from a --json file of an earlier run (same --full/--ops/--dtypes)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        _worker_main()
        return 0

    dtypes = args.dtypes.split(",") if args.dtypes else None
    units = select_units(args.full, args.ops.split(",") if args.ops else None, dtypes)
    started = time.monotonic()
    source, builds = source_state(), set()
    if args.from_json is not None:
        saved = json.loads(args.from_json.read_text())
        if isinstance(saved, list):  # results only
            saved = {"results": saved, "elapsed": 0.0}
        results = [Result(**r) for r in saved["results"]]
        elapsed = float(saved["elapsed"])
        source = saved.get("source", "unknown")
        builds = set(saved.get("builds", []))
    elif args.in_process:
        results = []
        for unit in units:
            results += list(check_unit(unit))
        builds.add(build_id())
    else:
        results = sweep(units, jobs=args.jobs, timeout=args.timeout, builds=builds)
    if args.from_json is None:
        elapsed = time.monotonic() - started
    backend = f"{source}; extension {', '.join(sorted(builds)) or 'unknown'}"
    if len(builds) > 1:
        backend += " (the backend was rebuilt during the run: the results mix these builds)"

    out = args.out if args.out is not None else (_default_report_path() if args.full else None)
    command = "python -m torchneuron.tools.op_coverage" + (" --full" if args.full else "")
    if args.ops:
        command += f" --ops {args.ops}"
    if args.dtypes:
        command += f" --dtypes {args.dtypes}"
    write_report(results, units, out, command, elapsed, full=args.full, backend=backend)
    if args.json is not None:
        saved = {
            "elapsed": elapsed,
            "source": source,
            "builds": sorted(builds),
            "results": [dataclasses.asdict(r) for r in results],
        }
        args.json.write_text(json.dumps(saved, indent=0))
    print("\n".join(_summary_rows(results)))
    for r in results:
        if r.status in (FAIL, ERROR):
            print(r.line())
    if out is not None:
        print(f"report: {out}")
    counts = _counts(results)
    return 0 if counts[FAIL] == 0 and counts[ERROR] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
