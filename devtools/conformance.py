"""What the conformance harnesses (op_coverage, module_coverage) share: the outcome of a
sample, copying samples to ``neuron``, and comparing a neuron result with the CPU's.

A sample is one of: ``pass``; ``fail`` (a mismatch: values, dtype, shape, device,
aliasing); ``error`` (an exception on neuron only, or a crash or timeout of the sample);
``cpu-error`` (the CPU raises too: not counted); ``no-grad`` (backward: nothing to
differentiate: not counted). A pass records how it was checked: bitwise (``exact``), within
``torch.testing.assert_close``'s default tolerance (``close``), within the database's own
looser tolerance (``override``), or by shape, dtype, layout and device only (``metadata``
for random values, ``unreproducible`` when the CPU itself gives another result on a rerun).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import math
import random
import sys
import types
import unittest
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

SEED = 1234
FORWARD = "forward"
BACKWARD = "backward"

PASS, FAIL, ERROR, CPU_ERROR, NO_GRAD = "pass", "fail", "error", "cpu-error", "no-grad"
COUNTED = (PASS, FAIL, ERROR)

# How a passing sample was checked.
EXACT = "exact"  # bitwise equal (NaN == NaN)
CLOSE = "close"  # within assert_close's default tolerance
OVERRIDE = "override"  # within the database's own looser tolerance
METADATA = "metadata"  # random / undefined values: shape, dtype, layout, device only
UNREPRODUCIBLE = "unreproducible"  # the CPU result changes from run to run: metadata only

# The order of the levels, strictest first (a sample checked at several places gets the
# loosest of them).
LEVELS = (EXACT, CLOSE, OVERRIDE, METADATA, UNREPRODUCIBLE)

Tolerance = tuple[float, float]


@dataclasses.dataclass
class Result:
    """The outcome of one sample of one (op or module, dtype, mode)."""

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
    """The samples of one op (or module) in one dtype and mode, run together."""

    op: str
    dtype: str
    mode: str


class Mismatch(Exception):
    """A difference between the neuron and the CPU result."""


class CpuError(Exception):
    """The CPU raised: the sample does not count."""


class NeuronError(Exception):
    """Neuron raised where the CPU did not."""


class NoGrad(Exception):
    """Backward: the sample has nothing to differentiate."""


def ensure_expecttest() -> None:
    """common_utils imports ``expecttest`` (a test-only dependency PyTorch does not install);
    the op and module databases do not use it, so a stand-in module is enough."""
    try:
        import expecttest  # noqa: F401
    except ImportError:
        stub = types.ModuleType("expecttest")
        stub.TestCase = unittest.TestCase  # type: ignore[attr-defined]
        stub.ACCEPT = False  # type: ignore[attr-defined]
        sys.modules["expecttest"] = stub


def seed_everything(seed: int) -> None:
    """Seeds torch (CPU and every neuron device), ``random`` and numpy."""
    torch.manual_seed(seed)
    random.seed(seed)
    with contextlib.suppress(ImportError):
        import numpy

        numpy.random.seed(seed)


def first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    text = f"{type(error).__name__}: {lines[0] if lines else ''}"
    return text if len(text) <= 240 else text[:237] + "..."


def run_classified(result: Result, body: Callable[[], str]) -> Result:
    """Runs `body` (which returns how the sample passed; warnings silenced) and records its
    outcome in `result`: a Mismatch is a fail, NeuronError an error, CpuError and NoGrad not
    counted, anything else a bug of the harness (an error, reported, not hidden)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result.checked = body()
    except Mismatch as error:
        result.status, result.reason = FAIL, str(error)
    except NeuronError as error:
        result.status, result.reason = ERROR, str(error)
    except CpuError as error:
        result.status, result.reason = CPU_ERROR, str(error)
    except NoGrad as error:
        result.status, result.reason = NO_GRAD, str(error)
    except Exception as error:
        result.status, result.reason = ERROR, "harness: " + first_line(error)
    if result.checked == UNREPRODUCIBLE:
        result.reason = "CPU result differs between runs: compared shape/dtype/device only"
    return result


def run_samples(
    unit: Unit,
    start: int,
    phase: Callable[[int, str], None] | None,
    generate: Callable[[], list[Any]],
    run: Callable[[Any, int, Callable[[str], None] | None], Result],
) -> Iterator[Result]:
    """The results of `run(sample, index, phase)` for the samples `generate()` returns, from
    index `start`; a generation that raises is one `cpu-error` (index -1) of the unit."""
    try:
        samples = generate()
    except Exception as error:
        reason = "sample generation: " + first_line(error)
        yield Result(unit.op, unit.dtype, unit.mode, -1, CPU_ERROR, reason)
        return
    for index in range(start, len(samples)):
        callback = (lambda p, i=index: phase(i, p)) if phase else None
        yield run(samples[index], index, callback)


_DATABASES: dict[str, list[Any]] = {}


def load_database(module: str, name: str) -> list[Any]:
    """A test database of PyTorch (``op_db``, ``module_db``), loaded once."""
    key = f"{module}.{name}"
    if key not in _DATABASES:
        ensure_expecttest()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _DATABASES[key] = list(getattr(importlib.import_module(module), name))
    return _DATABASES[key]


def declared_tolerance(
    decorators: Iterable[Any], dtype: torch.dtype, applies: Callable[[Any], bool]
) -> Tolerance | None:
    """The loosest (rtol, atol) that `decorators` (an OpInfo's or a ModuleInfo's) declare
    for `dtype` through ``toleranceOverride`` / ``precisionOverride``, counting only the
    DecorateInfo entries for which `applies(entry)` holds; None when they declare none."""
    from torch.testing._internal.common_device_type import precisionOverride, toleranceOverride
    from torch.testing._internal.opinfo.core import DecorateInfo

    rtol = atol = None
    for entry in decorators:
        found = [entry]
        if isinstance(entry, DecorateInfo):
            if not applies(entry):
                continue
            found = entry.decorators
        for decorator in found:
            if isinstance(decorator, toleranceOverride) and dtype in decorator.d:
                rtol = max(rtol or 0.0, decorator.d[dtype].rtol)
                atol = max(atol or 0.0, decorator.d[dtype].atol)
            elif isinstance(decorator, precisionOverride) and dtype in decorator.d:
                atol = max(atol or 0.0, decorator.d[dtype])
                rtol = max(rtol or 0.0, 0.0)
    return None if rtol is None or atol is None else (rtol, atol)


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
    obj: Any,
    device: str,
    memo: dict[tuple[int, int], torch.Tensor] | None = None,
    objects: dict[int, torch.Tensor] | None = None,
) -> Any:
    """`obj` with every tensor copied to `device` (recursively through lists, tuples and
    dicts); CPU devices (torch.device or the string ``"cpu"``) and CPU generators follow.
    With `objects` (a dict, empty at first), a tensor object that occurs twice is copied
    once, so that gradients accumulate into one leaf as on the CPU."""
    memo = {} if memo is None else memo
    if isinstance(obj, torch.Tensor):
        if objects is None:
            return _copy_tensor(obj, device, memo)
        if id(obj) not in objects:
            objects[id(obj)] = _copy_tensor(obj, device, memo)
        return objects[id(obj)]
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
        return [transform(x, device, memo, objects) for x in obj]
    if isinstance(obj, tuple):
        items = [transform(x, device, memo, objects) for x in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    if isinstance(obj, dict):
        return {k: transform(v, device, memo, objects) for k, v in obj.items()}
    return obj


def flatten(obj: Any) -> list[Any]:
    """The leaves of `obj` in order (through lists, tuples and dicts; torch.Size is a leaf)."""
    if isinstance(obj, (list, tuple)) and not isinstance(obj, torch.Size):
        return [leaf for x in obj for leaf in flatten(x)]
    if isinstance(obj, dict):
        return [leaf for k in obj for leaf in flatten(obj[k])]
    return [obj]


def tensors(obj: Any) -> list[torch.Tensor]:
    return [x for x in flatten(obj) if isinstance(x, torch.Tensor)]


def differentiable(outputs: Any) -> list[torch.Tensor]:
    """The floating-point (or complex) tensors of `outputs` that require grad."""
    return [
        t
        for t in tensors(outputs)
        if t.requires_grad and (t.dtype.is_floating_point or t.dtype.is_complex)
    ]


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


def describe(obj: Any) -> str:
    """A short text of a value: dtype and shape for tensors, recursively for containers."""
    if isinstance(obj, torch.Tensor):
        text = f"{_SHORT_DTYPE.get(obj.dtype, str(obj.dtype))}{list(obj.shape)}"
        if obj.layout != torch.strided:
            text += f"({obj.layout})"
        elif not obj.is_contiguous():
            text += f"(strides {list(obj.stride())})"
        return text.replace(" ", "")
    if isinstance(obj, (list, tuple)) and not isinstance(obj, torch.Size):
        inner = ", ".join(describe(x) for x in obj)
        return f"[{inner}]" if isinstance(obj, list) else f"({inner})"
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{k}={describe(v)}" for k, v in obj.items()) + "}"
    if callable(obj) and not isinstance(obj, torch.dtype):
        return getattr(obj, "__name__", type(obj).__name__)
    return repr(obj)


def describe_call(args: Any, kwargs: dict[str, Any]) -> str:
    """``describe`` of a call's arguments, at most 200 characters."""
    parts = [describe(a) for a in args] + [f"{k}={describe(v)}" for k, v in kwargs.items()]
    text = ", ".join(parts)
    return text if len(text) <= 200 else text[:197] + "..."


# ---------------------------------------------------------------------------------------------
# Comparing results


def check_close(
    actual: torch.Tensor, expected: torch.Tensor, rtol: float | None, atol: float | None
) -> None:
    try:
        torch.testing.assert_close(
            actual, expected, rtol=rtol, atol=atol, equal_nan=True, check_stride=False
        )
    except AssertionError as error:
        summary = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
        raise Mismatch(summary[:300]) from None


def compare(actual: Any, expected: Any, level: str | Tolerance, path: str) -> None:
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
            check_close(host, expected, 0.0, 0.0)
        elif level == CLOSE:
            check_close(host, expected, None, None)
        else:
            rtol, atol = level  # type: ignore[misc]
            check_close(host, expected, rtol, atol)
        return
    if isinstance(expected, (list, tuple)) and not isinstance(expected, torch.Size):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            raise Mismatch(f"{path}: {describe(actual)} on neuron, {describe(expected)} on cpu")
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            compare(a, e, level, f"{path}[{i}]")
        return
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(actual) != set(expected):
            raise Mismatch(f"{path}: {describe(actual)} on neuron, {describe(expected)} on cpu")
        for k in expected:
            compare(actual[k], expected[k], level, f"{path}[{k!r}]")
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


def compare_levels(
    actual: Any,
    expected: Any,
    override: Callable[[], Tolerance | None],
    random: bool,
    path: str = "output",
) -> str:
    """The strictest level at which `actual` matches `expected` (EXACT, CLOSE, OVERRIDE:
    within the tolerance `override()` returns, METADATA: `random` values); raises the
    default-tolerance Mismatch when none does."""
    if random:
        compare(actual, expected, METADATA, path)
        return METADATA
    try:
        compare(actual, expected, EXACT, path)
        return EXACT
    except Mismatch:
        pass
    try:
        compare(actual, expected, CLOSE, path)
        return CLOSE
    except Mismatch as error:
        tolerance = override()
        if tolerance is None:
            raise
        try:
            compare(actual, expected, tolerance, path)
        except Mismatch:
            raise error from None
        return OVERRIDE


def loosest(*levels: str) -> str:
    """The loosest of check levels (EXACT < CLOSE < OVERRIDE < METADATA < UNREPRODUCIBLE)."""
    return max(levels, key=LEVELS.index)


def compare_cpu(actual: Any, expected: Any) -> None:
    """Raises Mismatch when two CPU results differ beyond the default tolerance."""
    a, e = flatten(actual), flatten(expected)
    if len(a) != len(e):
        raise Mismatch("structure")
    for x, y in zip(a, e, strict=True):
        if isinstance(y, torch.Tensor):
            if not isinstance(x, torch.Tensor) or x.shape != y.shape or x.dtype != y.dtype:
                raise Mismatch("metadata")
            check_close(x.detach(), y.detach(), None, None)
