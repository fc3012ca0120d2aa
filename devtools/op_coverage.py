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

    python -m devtools.op_coverage                # the fast subset, summary only
    python -m devtools.op_coverage --full         # everything -> docs/op_coverage.md
    python -m devtools.op_coverage --ops add,mm --out /tmp/report.md
    python -m devtools.op_coverage --full --json run.json   # also every result
    python -m devtools.op_coverage --full --from-json run.json  # re-render only

The sweep runs the samples in worker processes (``--jobs``) with a per-sample timeout, so
a crash or a hang of one sample is recorded against it and the sweep goes on. The report
carries no date or commit, so rerunning it on unchanged code changes nothing.
``KNOWN_CAUSES`` maps the remaining failures to their causes.
What the sweep covers (the op database, dtypes, units, the fast subset, per-op tables) is in
op_coverage_db.py, the report in op_coverage_report.py. The pieces shared with the module
harness (module_coverage.py) live in conformance.py (outcomes, copying samples, comparing),
sweep.py (workers, command line) and report_sections.py.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

from devtools import sweep
from devtools.conformance import (
    BACKWARD,
    COUNTED,  # noqa: F401  (tests read it from here)
    ERROR,  # noqa: F401  (tests read it from here)
    FAIL,  # noqa: F401  (tests read it from here)
    FORWARD,
    METADATA,
    PASS,
    SEED,
    UNREPRODUCIBLE,
    CpuError,
    Mismatch,
    NeuronError,
    NoGrad,
    Result,
    Unit,
    compare,
    compare_cpu,
    compare_levels,
    describe_call,
    differentiable,
    first_line,
    flatten,
    run_classified,
    run_samples,
    seed_everything,
    tensors,
    transform,
)
from devtools.op_coverage_db import (
    DTYPES,
    FAST_OPS,
    HOST_ARGUMENTS,
    RANDOM_OPS,
    op_key,
    ops_by_key,
    tolerance_override,
    units_for,
)
from devtools.op_coverage_report import summary, write_report

# ---------------------------------------------------------------------------------------------
# Moving samples to neuron and comparing


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


def describe_sample(sample: Any) -> str:
    """A short text of a SampleInput: dtypes and shapes of the tensors, other values."""
    return describe_call((sample.input, *sample.args), sample.kwargs)


def _compare_levels(actual: Any, expected: Any, op: Any, dtype: torch.dtype, random: bool) -> str:
    """compare_levels with the OpInfo's own tolerance for `dtype` as the override."""
    return compare_levels(actual, expected, lambda: tolerance_override(op, dtype), random)


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
    cpu_outs, neuron_outs = flatten(cpu_out), flatten(neuron_out)
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


def generate_samples(op: Any, dtype: str, mode: str) -> list[Any]:
    """The OpInfo's sample inputs on the CPU, generated from a fixed seed (reproducible, so a
    restarted worker regenerates the same list)."""
    seed_everything(SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return list(op.sample_inputs("cpu", DTYPES[dtype], requires_grad=mode == BACKWARD))


def _call(op: Any, sample_input: Any, args: Any, kwargs: Any, post: Callable[[Any], Any]) -> Any:
    return post(op(sample_input, *args, **kwargs))


def _default_device(neuron_sample: Any) -> contextlib.AbstractContextManager[Any]:
    """Factory samples without any tensor (``arange(5)``) create their result on the default
    device: make that neuron for the neuron run, as a device's own test suite does."""
    return torch.device("neuron") if not tensors(neuron_sample) else contextlib.nullcontext()


def _run_forward(
    op: Any, sample: Any, dtype: torch.dtype, random: bool, phase: Callable[[str], None]
) -> str:
    """Runs one forward sample on both devices; returns how it passed, raises Mismatch,
    NeuronError or CpuError."""
    post = sample.output_process_fn_grad
    neuron_sample = neuron_copy(op, sample)
    pristine = transform((sample.input, sample.args, sample.kwargs), "cpu")
    phase("cpu")
    seed_everything(SEED)
    try:
        expected = _call(op, sample.input, sample.args, sample.kwargs, post)
    except Exception as error:
        raise CpuError(first_line(error)) from error
    phase("neuron")
    seed_everything(SEED)
    try:
        with _default_device(neuron_sample):
            actual = _call(op, *neuron_sample, post)
    except Exception as error:
        raise NeuronError(first_line(error)) from error
    phase("compare")
    cpu_inputs = tensors((sample.input, sample.args, sample.kwargs))
    neuron_inputs = tensors(neuron_sample)
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
        compare(actual, expected, METADATA, "output")
        return UNREPRODUCIBLE


def _cpu_unreproducible(op: Any, pristine: Any, post: Callable[[Any], Any], expected: Any) -> bool:
    """True when the CPU gives another result for the same inputs under another seed."""
    seed_everything(SEED + 1)
    try:
        again = _call(op, *pristine, post)
        compare_cpu(again, expected)
    except Mismatch:
        return True
    except Exception:
        return False
    return False


def _run_backward(op: Any, sample: Any, random: bool, phase: Callable[[str], None]) -> str:
    """Runs one sample forward and backward (autograd.grad of the outputs with a fixed random
    cotangent) on both devices and compares the input gradients."""
    post = sample.output_process_fn_grad
    neuron_sample = neuron_copy(op, sample)
    phase("cpu")
    cpu_inputs = [t for t in tensors((sample.input, sample.args, sample.kwargs)) if t.requires_grad]
    if not cpu_inputs:
        raise NoGrad("no input requires grad")
    seed_everything(SEED)
    try:
        cpu_out = differentiable(_call(op, sample.input, sample.args, sample.kwargs, post))
        if not cpu_out:
            raise NoGrad("no differentiable output")
        generator = torch.Generator().manual_seed(SEED)
        cotangents = [torch.randn(t.shape, generator=generator, dtype=t.dtype) for t in cpu_out]
        expected = torch.autograd.grad(cpu_out, cpu_inputs, cotangents, allow_unused=True)
    except NoGrad:
        raise
    except Exception as error:
        raise CpuError(first_line(error)) from error
    phase("neuron")
    neuron_inputs = [t for t in tensors(neuron_sample) if t.requires_grad]
    seed_everything(SEED)
    try:
        with _default_device(neuron_sample):
            neuron_out = differentiable(_call(op, *neuron_sample, post))
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
        raise NeuronError(first_line(error)) from error
    phase("compare")
    try:
        return _compare_levels(list(actual), list(expected), op, torch.float32, random)
    except Mismatch as error:
        raise Mismatch(str(error).replace("output", "grad", 1)) from None


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

    def body() -> str:
        if mode == FORWARD:
            return _run_forward(op, sample, DTYPES[dtype], random, phase)
        return _run_backward(op, sample, random, phase)

    run_classified(result, body)
    if result.checked == METADATA:
        result.reason = f"{RANDOM_OPS[key]}: compared shape/dtype/device only"
    return result


def check_unit(
    unit: Unit, start: int = 0, phase: Callable[[int, str], None] | None = None
) -> Iterator[Result]:
    """Runs the samples of `unit` (from index `start`) in this process."""
    op = ops_by_key()[unit.op]
    return run_samples(
        unit,
        start,
        phase,
        lambda: generate_samples(op, unit.dtype, unit.mode),
        lambda sample, index, callback: run_sample(
            op, sample, unit.dtype, unit.mode, index, callback
        ),
    )


def check_op(key: str, dtype: str, mode: str) -> list[Result]:
    """All samples of one op in one dtype and mode, in this process (for pytest)."""
    return list(check_unit(Unit(key, dtype, mode)))


# ---------------------------------------------------------------------------------------------
# Command line

HARNESS = sweep.Harness(
    module="devtools.op_coverage",
    what="OpInfo",
    option="ops",
    dtypes=list(DTYPES),
    report="op_coverage.md",
    table=ops_by_key,
    fast=FAST_OPS,
    units_for=units_for,
    check_unit=check_unit,
    write_report=lambda run, units, path, command, full: write_report(
        run.results, units, path, command, run.elapsed, full
    ),
    summary=summary,
)


def select_units(full: bool, ops: list[str] | None, dtypes: list[str] | None) -> list[Unit]:
    """The units of `ops`, of every OpInfo (`full`), or of the fast subset."""
    return HARNESS.select(full, ops, dtypes)


def main(argv: list[str] | None = None) -> int:
    return sweep.main(HARNESS, argv)


if __name__ == "__main__":
    sys.exit(main())
