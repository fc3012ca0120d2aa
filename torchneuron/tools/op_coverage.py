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
The pieces shared with the module harness (module_coverage.py) live in conformance.py
(outcomes, copying samples, comparing), sweep.py (workers, command line) and
report_sections.py.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from torchneuron.tools import report_sections as sections
from torchneuron.tools import sweep
from torchneuron.tools.conformance import (
    BACKWARD,
    CLOSE,
    COUNTED,  # noqa: F401  (tests read it from here)
    CPU_ERROR,
    ERROR,  # noqa: F401  (tests read it from here)
    EXACT,
    FAIL,  # noqa: F401  (tests read it from here)
    FORWARD,
    METADATA,
    NO_GRAD,
    OVERRIDE,
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
    declared_tolerance,
    describe_call,
    differentiable,
    first_line,
    flatten,
    load_database,
    run_classified,
    run_samples,
    seed_everything,
    tensors,
    transform,
)

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "int64": torch.int64,
    "bool": torch.bool,
}


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


# ---------------------------------------------------------------------------------------------
# The op database


def load_op_db() -> list[Any]:
    """PyTorch's OpInfo database (``op_db``)."""
    return load_database("torch.testing._internal.common_methods_invocations", "op_db")


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

    def applies(info: Any) -> bool:
        on_cpu = info.device_type in (None, "cpu") and bool(info.active_if)
        return on_cpu and (info.dtypes is None or dtype in info.dtypes)

    return declared_tolerance(op.decorators or (), dtype, applies)


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
# The report


def summarize(results: list[Result]) -> dict[str, dict[str, int]]:
    """Status counts per mode and overall."""
    table: dict[str, dict[str, int]] = {}
    for mode in (FORWARD, BACKWARD):
        table[mode] = dict(sections.counts(r for r in results if r.mode == mode))
    table["all"] = dict(sections.counts(results))
    return table


def _summary_rows(results: list[Result]) -> list[str]:
    groups: list[tuple[str, Callable[[Result], bool]]] = [
        ("forward", lambda r: r.mode == FORWARD),
        ("backward (float32 grads)", lambda r: r.mode == BACKWARD),
        ("all", lambda r: True),
    ]
    return sections.summary_rows(results, groups, 0.99)


def cause_of(r: Result) -> str:
    """The known cause of a non-pass, or 'unexplained: <reason>'."""
    return sections.cause_of(r, KNOWN_CAUSES)


MODULE_REPORT = "module_coverage.md"


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
    counts = sections.counts(results)

    out: list[str] = []
    out.append("# OpInfo conformance of `neuron` against the CPU")
    out.append("")
    out.append(
        f"Generated by `{command}` (torchneuron/tools/op_coverage.py) with torch "
        f"{torch.__version__}, {len(op_names)} OpInfos of `op_db`, {len(units)} (op, dtype, mode) "
        f"units, in {elapsed / 60:.1f} min. Do not edit by hand; rerun the command. The "
        f"ModuleInfo sweep is in [{MODULE_REPORT}]({MODULE_REPORT})."
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
    module_table = sections.quoted_summary(Path(__file__).parents[2] / "docs" / MODULE_REPORT)
    if module_table:
        out.append("")
        out.append("## Modules")
        out.append("")
        out.append(
            f"The ModuleInfo sweep (`python -m torchneuron.tools.module_coverage --full`, every "
            f"module of `module_db` forward and backward, train and eval, float32 and bfloat16), "
            f"as [{MODULE_REPORT}]({MODULE_REPORT}) last reported it:"
        )
        out.append("")
        out.extend(module_table)
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

    out += sections.failures_section(results, KNOWN_CAUSES, "ops")
    out += sections.unreproducible_section(results)
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
            cell = sections.cell(by_cell.get((key, dtype, mode), []))
            if key in RANDOM_OPS:
                cell += " (m)"
            cells.append(cell)
        out.append(f"| `{sections.md(key)}` | " + " | ".join(cells) + " |")
    out.append("")

    if full:
        not_run = [k for k in ops if k not in set(op_names)]
        out.append(f"## OpInfos not run: none of the five dtypes on the CPU ({len(not_run)})")
        out.append("")
        for key in not_run:
            cpu = sorted(str(d).replace("torch.", "") for d in ops[key].supported_dtypes("cpu"))
            out.append(f"- `{key}`: CPU dtypes {', '.join(cpu) if cpu else 'none'}")
        out.append("")

    out += sections.not_counted_section(
        results, "Not counted: samples that raise on the CPU, backward without grads", "ops"
    )
    return sections.write_text(out, path)


# ---------------------------------------------------------------------------------------------
# Command line

HARNESS = sweep.Harness(
    module="torchneuron.tools.op_coverage",
    what="OpInfo",
    option="ops",
    dtypes=list(DTYPES),
    report="op_coverage.md",
    table=ops_by_key,
    fast=FAST_OPS,
    units_for=units_for,
    check_unit=check_unit,
    write_report=lambda run, units, path, command, full: write_report(
        run.results, units, path, command, run.elapsed, full, run.backend
    ),
    summary=_summary_rows,
)


def select_units(full: bool, ops: list[str] | None, dtypes: list[str] | None) -> list[Unit]:
    """The units of `ops`, of every OpInfo (`full`), or of the fast subset."""
    return HARNESS.select(full, ops, dtypes)


def main(argv: list[str] | None = None) -> int:
    return sweep.main(HARNESS, argv)


if __name__ == "__main__":
    sys.exit(main())
