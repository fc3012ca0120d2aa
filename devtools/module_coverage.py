"""ModuleInfo conformance harness: PyTorch's module database run on ``neuron`` against the CPU.

For every ModuleInfo of ``torch.testing._internal.common_modules.module_db``, in float32 and
bfloat16, in train and eval mode, the ModuleInfo's inputs are generated on the CPU
(``module_inputs_func(..., device='cpu', requires_grad=True, training=...)``, fixed seed).
For each sample the module is built on the CPU from a fixed seed, deep-copied to ``neuron``
(the same parameters and buffers), and both run the sample's forward input (copied to
``neuron`` with the same sizes and strides) with the global seed reset before each run.
Each sample is checked in five modes:

* ``train forward`` / ``eval forward``: the outputs, the buffers after the call (running
  statistics), the parameters after the call (lazy modules initialise them there) and the
  inputs after the call must match;
* ``train backward`` / ``eval backward``: ``torch.autograd.grad`` of the differentiable
  outputs with a fixed random cotangent, with respect to the inputs that require grad and
  the module's parameters, must match;
* ``eval no_grad``: the forward under ``torch.no_grad()`` (inference; where PyTorch's
  transformer modules take their fused fast paths) must match.

Tolerances, outcomes (``pass``, ``fail``, ``error``, ``cpu-error``, ``no-grad``), the worker
processes and the report sections are the OpInfo harness's (conformance.py, sweep.py,
report_sections.py). A
sample outside the default tolerance passes when the ModuleInfo declares a looser one for
the CPU (``toleranceOverride``/``precisionOverride`` for ``test_forward`` or
``test_cpu_gpu_parity``). ``KNOWN_CAUSES`` maps the remaining failures to their causes.

Usage::

    python -m devtools.module_coverage              # the fast subset, summary only
    python -m devtools.module_coverage --full       # everything -> docs/module_coverage.md
    python -m devtools.module_coverage --modules nn.Linear,nn.LSTM --out /tmp/r.md
    python -m devtools.module_coverage --full --json run.json   # also every result
    python -m devtools.module_coverage --full --from-json run.json  # re-render only
"""

from __future__ import annotations

import contextlib
import copy
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from devtools import sweep
from devtools.conformance import (
    EXACT,
    METADATA,
    PASS,
    SEED,
    UNREPRODUCIBLE,
    CpuError,
    Mismatch,
    NeuronError,
    NoGrad,
    Result,
    Tolerance,
    Unit,
    compare,
    compare_cpu,
    compare_levels,
    declared_tolerance,
    describe_call,
    differentiable,
    first_line,
    flatten,
    loosest,
    run_classified,
    run_samples,
    seed_everything,
    tensors,
    transform,
)
from devtools.module_coverage_db import (
    BACKWARD_MODES,
    DTYPES,
    EVAL_NO_GRAD,
    FAST_MODULES,
    MODES,
    modules_by_name,
)
from devtools.module_coverage_report import summary, write_report

Override = Callable[[], Tolerance | None]  # the ModuleInfo's own tolerance, asked when needed


def training_of(mode: str) -> bool:
    return mode.startswith("train")


def units_for(info: Any, dtypes: Iterable[str] | None = None) -> list[Unit]:
    """The units of one module: every mode in each of `dtypes` (default: DTYPES)."""
    wanted = list(dtypes) if dtypes is not None else list(DTYPES)
    return [Unit(info.name, d, mode) for d in DTYPES if d in wanted for mode in MODES]


def tolerance_override(info: Any, dtype: torch.dtype, training: bool) -> Tolerance | None:
    """The loosest (rtol, atol) the ModuleInfo declares for `dtype` on the CPU in its forward
    or CPU-parity test."""
    params = {"module_info": info, "dtype": dtype, "training": training}

    def applies(entry: Any) -> bool:
        tests = ("test_forward", "test_cpu_gpu_parity")
        return any(entry.is_active("TestModule", t, "cpu", dtype, params) for t in tests)

    return declared_tolerance(info.decorators or (), dtype, applies)


def generate_samples(info: Any, dtype: str, training: bool) -> list[Any]:
    """The ModuleInfo's inputs on the CPU, generated from a fixed seed (reproducible, so a
    restarted worker regenerates the same list)."""
    seed_everything(SEED)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return list(
            info.module_inputs_func(
                info, device="cpu", dtype=DTYPES[dtype], requires_grad=True, training=training
            )
        )


def describe_sample(info: Any, sample: Any) -> str:
    """``desc: Module(constructor arguments)(forward arguments)``, at most ~240 characters."""
    construct = sample.constructor_input
    text = f"{info.module_cls.__name__}({describe_call(construct.args, construct.kwargs)})"
    if sample.forward_input is not None:
        forward = sample.forward_input
        text += f"({describe_call(forward.args, forward.kwargs)})"
    if sample.desc:
        text = f"{sample.desc}: {text}"
    return text if len(text) <= 240 else text[:237] + "..."


# ---------------------------------------------------------------------------------------------
# Running samples


class _Pair:
    """One sample's module and forward input on the CPU and on neuron."""

    def __init__(self, info: Any, sample: Any, dtype: torch.dtype, training: bool) -> None:
        construct, forward = sample.constructor_input, sample.forward_input
        self.args, self.kwargs = forward.args, forward.kwargs
        seed_everything(SEED)
        self.cpu = info.module_cls(*construct.args, **construct.kwargs).to(dtype)
        self.cpu.train(training)
        # The CPU module as built, and the inputs as given, for a rerun (reproducibility).
        self.pristine = copy.deepcopy(self.cpu)
        self.pristine_input = transform((self.args, self.kwargs), "cpu")

    def to_neuron(self) -> None:
        self.neuron = copy.deepcopy(self.pristine).to("neuron")
        self.neuron_args, self.neuron_kwargs = transform(
            (self.args, self.kwargs), "neuron", objects={}
        )

    def forward(self, on_neuron: bool, no_grad: bool) -> Any:
        if on_neuron:
            return _call(self.neuron, self.neuron_args, self.neuron_kwargs, no_grad, SEED)
        return _call(self.cpu, self.args, self.kwargs, no_grad, SEED)

    def cpu_inputs(self) -> list[torch.Tensor]:
        return tensors((self.args, self.kwargs))

    def neuron_inputs(self) -> list[torch.Tensor]:
        return tensors((self.neuron_args, self.neuron_kwargs))


def _call(module: torch.nn.Module, args: Any, kwargs: Any, no_grad: bool, seed: int) -> Any:
    """The module's forward under `seed` (torch.no_grad() if `no_grad`)."""
    if isinstance(module, torch.nn.modules.lazy.LazyModuleMixin):
        # Lazy modules create their parameters at the first call: under the same seed on
        # both devices, and without recording it (as PyTorch's own module tests do).
        seed_everything(SEED)
        with torch.no_grad():
            module(*args, **kwargs)
    seed_everything(seed)
    with torch.no_grad() if no_grad else contextlib.nullcontext():
        return module(*args, **kwargs)


def _run_cpu_then_neuron(
    pair: _Pair, no_grad: bool, phase: Callable[[str], None]
) -> tuple[Any, Any]:
    """The forward's results on the CPU and on neuron. The copy to neuron is made first: the
    CPU forward may write to its inputs."""
    phase("neuron")
    try:
        pair.to_neuron()
    except Exception as error:
        raise NeuronError("copy to neuron: " + first_line(error)) from error
    phase("cpu")
    try:
        expected = pair.forward(on_neuron=False, no_grad=no_grad)
    except Exception as error:
        raise CpuError(first_line(error)) from error
    phase("neuron")
    try:
        actual = pair.forward(on_neuron=True, no_grad=no_grad)
    except Exception as error:
        raise NeuronError(first_line(error)) from error
    return expected, actual


def _run_forward(
    pair: _Pair, override: Override, no_grad: bool, phase: Callable[[str], None]
) -> str:
    """Forward on both devices; compares outputs, buffers, parameters and inputs after the
    call. Returns how the sample passed; raises Mismatch, NeuronError or CpuError."""
    expected, actual = _run_cpu_then_neuron(pair, no_grad, phase)
    phase("compare")
    try:
        compare(actual, expected, METADATA, "output")  # the same structure, then the values
        parts = [("output", actual, expected)]
        for what, named in (("buffers", "named_buffers"), ("parameters", "named_parameters")):
            cpu_state = dict(getattr(pair.cpu, named)())
            neuron_state = dict(getattr(pair.neuron, named)())
            parts.append((what, neuron_state, cpu_state))
        parts.append(("inputs", pair.neuron_inputs(), pair.cpu_inputs()))
        return loosest(*(_compare_parts(*part, override) for part in parts))
    except Mismatch:
        if not _cpu_unreproducible(pair, no_grad, expected):
            raise
        compare(actual, expected, METADATA, "output")
        return UNREPRODUCIBLE


def _compare_parts(what: str, actual: Any, expected: Any, override: Override) -> str:
    """compare_levels for each part of `expected` (the leaves of an output, the entries of
    a dict of buffers or gradients), so that a mismatch names the part: ``output[1]: ``,
    ``buffers['running_mean']: ``, ``grad['weight']: ``."""
    if isinstance(expected, dict):
        if set(actual) != set(expected):
            raise Mismatch(f"{what}: {sorted(actual)} on neuron, {sorted(expected)} on cpu")
        named = [(f"{what}[{k!r}]", actual[k], expected[k]) for k in expected]
    else:
        leaves = flatten(expected)
        paths = [what] if len(leaves) == 1 else [f"{what}[{i}]" for i in range(len(leaves))]
        named = list(zip(paths, flatten(actual), leaves, strict=True))
    levels = [EXACT]
    for path, a, e in named:
        try:
            levels.append(compare_levels(a, e, override, False, path))
        except Mismatch as error:
            text = str(error)
            raise Mismatch(text if text.startswith(path) else f"{path}: {text}") from None
    return loosest(*levels)


def _cpu_unreproducible(pair: _Pair, no_grad: bool, expected: Any) -> bool:
    """True when the CPU gives another result for the same module and inputs under another
    seed (a module whose values are random by nature)."""
    args, kwargs = transform(pair.pristine_input, "cpu")
    try:
        again = _call(copy.deepcopy(pair.pristine), args, kwargs, no_grad, SEED + 1)
        compare_cpu(again, expected)
    except Mismatch:
        return True
    except Exception:
        return False
    return False


def _gradient_targets(module: torch.nn.Module, inputs: list[torch.Tensor]) -> dict[str, Any]:
    targets: dict[str, Any] = {f"input {i}": t for i, t in enumerate(inputs) if t.requires_grad}
    targets.update((name, p) for name, p in module.named_parameters() if p.requires_grad)
    return targets


def _run_backward(pair: _Pair, override: Override, phase: Callable[[str], None]) -> str:
    """Forward and ``autograd.grad`` with a fixed random cotangent on both devices; compares
    the gradients of the inputs and of the parameters."""
    expected_out, actual_out = _run_cpu_then_neuron(pair, False, phase)
    phase("cpu")
    cpu_out = differentiable(expected_out)
    if not cpu_out:
        raise NoGrad("no differentiable output")
    cpu_targets = _gradient_targets(pair.cpu, pair.cpu_inputs())
    if not cpu_targets:
        raise NoGrad("no input or parameter requires grad")
    generator = torch.Generator().manual_seed(SEED)
    cotangents = [torch.randn(t.shape, generator=generator, dtype=t.dtype) for t in cpu_out]
    try:
        expected = torch.autograd.grad(
            cpu_out, list(cpu_targets.values()), cotangents, allow_unused=True
        )
    except Exception as error:
        raise CpuError(first_line(error)) from error
    phase("neuron")
    neuron_out = differentiable(actual_out)
    if len(neuron_out) != len(cpu_out):
        raise Mismatch(f"{len(neuron_out)} differentiable outputs on neuron, {len(cpu_out)} on cpu")
    neuron_targets = _gradient_targets(pair.neuron, pair.neuron_inputs())
    if list(neuron_targets) != list(cpu_targets):
        raise Mismatch(f"grad targets {list(neuron_targets)} on neuron, {list(cpu_targets)} on cpu")
    try:
        actual = torch.autograd.grad(
            neuron_out,
            list(neuron_targets.values()),
            [c.to("neuron") for c in cotangents],
            allow_unused=True,
        )
    except Exception as error:
        raise NeuronError(first_line(error)) from error
    phase("compare")
    return _compare_parts(
        "grad",
        dict(zip(neuron_targets, actual, strict=True)),
        dict(zip(cpu_targets, expected, strict=True)),
        override,
    )


@contextlib.contextmanager
def _device_kernel_threads() -> Iterator[None]:
    """Both sides with the intra-op threads PyTorch's kernels get for device ops
    (``_C._host_kernel_threads``: one on a 2-CPU host with asynchronous launches), so the CPU
    reference runs each kernel as the device did: several (LayerNorm's backward) split their
    sums by the thread count, which moves bfloat16 results by a rounding step."""
    import torchneuron

    threads = torch.get_num_threads()
    device = torchneuron._C._host_kernel_threads()
    if device != threads:
        torch.set_num_threads(device)
    try:
        yield
    finally:
        if device != threads:
            torch.set_num_threads(threads)


def run_sample(
    info: Any,
    sample: Any,
    dtype: str,
    mode: str,
    index: int,
    phase: Callable[[str], None] | None = None,
) -> Result:
    """Runs one sample of `info` in `mode` on the CPU and neuron and classifies it."""
    result = Result(info.name, dtype, mode, index, PASS, sample=describe_sample(info, sample))
    training = training_of(mode)
    phase = phase or (lambda _: None)

    def override() -> Tolerance | None:
        return tolerance_override(info, DTYPES[dtype], training)

    def body() -> str:
        with _device_kernel_threads():
            return run()

    def run() -> str:
        if sample.forward_input is None:
            raise CpuError("the sample has no forward input")
        phase("cpu")
        try:
            pair = _Pair(info, sample, DTYPES[dtype], training)
        except Exception as error:
            raise CpuError("construction: " + first_line(error)) from error
        if mode in BACKWARD_MODES:
            return _run_backward(pair, override, phase)
        return _run_forward(pair, override, mode == EVAL_NO_GRAD, phase)

    return run_classified(result, body)


def check_unit(
    unit: Unit, start: int = 0, phase: Callable[[int, str], None] | None = None
) -> Iterator[Result]:
    """Runs the samples of `unit` (from index `start`) in this process."""
    info = modules_by_name()[unit.op]
    return run_samples(
        unit,
        start,
        phase,
        lambda: generate_samples(info, unit.dtype, training_of(unit.mode)),
        lambda sample, index, callback: run_sample(
            info, sample, unit.dtype, unit.mode, index, callback
        ),
    )


def check_module(name: str, dtype: str, mode: str) -> list[Result]:
    """All samples of one module in one dtype and mode, in this process (for pytest)."""
    return list(check_unit(Unit(name, dtype, mode)))


# ---------------------------------------------------------------------------------------------
# Command line


def select_units(full: bool, names: list[str] | None, dtypes: list[str] | None) -> list[Unit]:
    """The units of `names`, of every ModuleInfo (`full`), or of the fast subset."""
    return harness().select(full, names, dtypes)


def harness() -> sweep.Harness:
    return sweep.Harness(
        module="devtools.module_coverage",
        what="ModuleInfo",
        option="modules",
        dtypes=list(DTYPES),
        report="module_coverage.md",
        table=modules_by_name,
        fast=FAST_MODULES,
        units_for=units_for,
        check_unit=check_unit,
        write_report=write_report,
        summary=summary,
    )


def main(argv: list[str] | None = None) -> int:
    return sweep.main(harness(), argv)


if __name__ == "__main__":
    sys.exit(main())
