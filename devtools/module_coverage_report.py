"""The markdown report of the ModuleInfo conformance harness (module_coverage.py)."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import torch

from devtools import report_sections as sections
from devtools import sweep
from devtools.conformance import (
    CLOSE,
    CPU_ERROR,
    ERROR,
    EXACT,
    FAIL,
    METADATA,
    NO_GRAD,
    OVERRIDE,
    PASS,
    SEED,
    UNREPRODUCIBLE,
    Result,
    Unit,
)
from devtools.module_coverage_db import (
    BACKWARD_MODES,
    DTYPES,
    EVAL_NO_GRAD,
    KNOWN_CAUSES,
    MODES,
    RANDOM_BY_NATURE,
    declared_dtypes,
    load_module_db,
    modules_by_name,
)

TARGET = 0.995


def summary(results: list[Result]) -> list[str]:
    """The summary table: forward, inference, backward, per dtype, all."""
    groups: list[tuple[str, Callable[[Result], bool]]] = [
        ("forward (train, eval)", lambda r: r.mode not in BACKWARD_MODES + (EVAL_NO_GRAD,)),
        ("forward under no_grad (eval)", lambda r: r.mode == EVAL_NO_GRAD),
        ("backward (train, eval)", lambda r: r.mode in BACKWARD_MODES),
    ]
    groups += [(f"all {d}", lambda r, d=d: r.dtype == d) for d in DTYPES]
    groups.append(("all", lambda r: True))
    groups.append(("all but the pending causes", lambda r: not _pending(r)))
    return sections.summary_rows(results, groups, TARGET)


def _pending(r: Result) -> bool:
    """A non-pass whose known cause is fixed on a branch not merged yet."""
    failed = r.status in (FAIL, ERROR)
    return failed and sections.cause_of(r, KNOWN_CAUSES).startswith("pending")


def _method() -> list[str]:
    return [
        "## Method",
        "",
        "- Modules and samples: every ModuleInfo of `torch.testing._internal.common_modules."
        "module_db`, in float32 and bfloat16 (bfloat16 also where the ModuleInfo does not "
        "declare it: the CPU decides, and what it cannot run is `cpu-error`), in train and eval "
        "mode; the samples are `module_inputs_func(module_info, device='cpu', dtype=..., "
        f"requires_grad=True, training=...)` generated from seed {SEED}.",
        "- Each sample: the module is built on the CPU from its `constructor_input` under a "
        "fixed seed, converted to the dtype, put in train or eval mode, and deep-copied to "
        "`neuron` (`copy.deepcopy(module).to('neuron')`: the same parameters and buffers). "
        "The forward input is copied to `neuron` with the same sizes, strides and storage "
        "offset (a tensor passed twice stays one tensor). The global seed is reset before each "
        "forward on each device. Lazy modules are initialised by a first call under "
        "`torch.no_grad()` on each device (the same seed), as in PyTorch's module tests.",
        "- Forward (`train forward`, `eval forward`): the outputs must be neuron tensors and "
        "match the CPU's; so must the buffers after the call (BatchNorm running statistics, "
        "`num_batches_tracked`), the parameters after the call (a lazy module's initialisation) "
        "and the inputs after the call.",
        "- `eval no_grad`: the eval forward under `torch.no_grad()`; the outputs are compared "
        "(inference: the batched `batch_first` samples of `nn.Transformer` and "
        "`nn.TransformerDecoderLayer` take PyTorch's fused fast paths here, "
        "`_transformer_encoder_layer_fwd`, `_native_multi_head_attention` and, with a padding "
        "mask, nested tensors).",
        "- Backward (`train backward`, `eval backward`): `torch.autograd.grad` of the "
        "differentiable outputs with a fixed random cotangent (normal, seed fixed) with respect "
        "to the inputs that require grad and every parameter; each gradient is compared.",
        "- Tolerance: `torch.testing.assert_close` defaults for the dtype (float32 rtol 1.3e-6 "
        "atol 1e-5; bfloat16 rtol 1.6e-2 atol 1e-5; integers and bool exact), `equal_nan=True`, "
        "strides not compared. A sample outside them passes if the ModuleInfo declares a looser "
        "`toleranceOverride`/`precisionOverride` for the CPU in `test_forward` or "
        "`test_cpu_gpu_parity` (counted above as 'ModuleInfo's own tolerance').",
        "- Random by nature: "
        + ", ".join(f"`{n}`" for n in RANDOM_BY_NATURE)
        + " (random pooling regions) are compared by value like every other module: the "
        "neuron generator owns a CPU engine, so under the same seed it draws the same numbers. "
        "A sample whose CPU result changes when the CPU runs it again under another seed would "
        "be compared by shape, dtype, layout and device only (listed below).",
        "- Each sample runs in a worker process with a timeout; a crash or a timeout is an "
        "`error` of that sample. `cpu-error` (the CPU raises too, including ModuleInfo samples "
        "the CPU itself cannot run) and `no-grad` samples are not counted.",
        "",
    ]


def _per_module(
    results: list[Result], units: list[Unit], names: list[str], declared: dict[str, list[str]]
) -> list[str]:
    by_cell: dict[tuple[str, str, str], list[Result]] = defaultdict(list)
    for r in results:
        by_cell[(r.op, r.dtype, r.mode)].append(r)
    unit_set = set(units)
    out = [
        "## Per module, dtype and mode",
        "",
        "Cells: pass/fail/error samples; `+N cpu` samples that raise on the CPU too (not "
        "counted), `+N no-grad` backward samples with nothing to differentiate. '(undeclared)': "
        "a dtype the ModuleInfo does not declare for the CPU.",
        "",
        "| module | dtype | " + " | ".join(MODES) + " |",
        "|---|---|" + "---|" * len(MODES),
    ]
    for name in names:
        for dtype in DTYPES:
            if not any(Unit(name, dtype, mode) in unit_set for mode in MODES):
                continue
            cells = [
                sections.cell(by_cell.get((name, dtype, mode), []))
                if Unit(name, dtype, mode) in unit_set
                else "—"
                for mode in MODES
            ]
            label = dtype if dtype in declared.get(name, []) else f"{dtype} (undeclared)"
            out.append(f"| `{name}` | {label} | " + " | ".join(cells) + " |")
    return [*out, ""]


def write_report(
    run: sweep.Run, units: list[Unit], path: Path | None, command: str, full: bool = False
) -> str:
    """Writes the markdown report (to `path` if given) and returns it."""
    results = run.results
    names = list(dict.fromkeys(u.op for u in units))
    table = modules_by_name()
    declared = {name: declared_dtypes(table[name]) for name in names}
    checked = Counter(r.checked for r in results if r.status == PASS)
    counts = sections.counts(results)
    undeclared = [
        r for r in results if r.dtype not in declared.get(r.op, []) and r.status in (PASS, FAIL)
    ]
    out = [
        "# ModuleInfo conformance of `neuron` against the CPU",
        "",
        f"Generated by `{command}` (devtools/module_coverage.py) with torch "
        f"{torch.__version__}, {len(names)} ModuleInfos of `module_db`"
        + (f" (all {len(load_module_db())})" if full else "")
        + f", {len(units)} (module, dtype, mode) units, in {run.elapsed / 60:.1f} min. Do not "
        "edit by hand; rerun the command. The OpInfo sweep is in [op_coverage.md](op_coverage.md).",
        "",
        "## Summary",
        "",
        *summary(results),
        "",
        f"Of the passing samples, {checked[EXACT]} are bitwise equal to the CPU, {checked[CLOSE]} "
        f"within `assert_close`'s default tolerance, {checked[OVERRIDE]} within the ModuleInfo's "
        f"own declared tolerance; {checked[METADATA] + checked[UNREPRODUCIBLE]} (CPU result not "
        "reproducible from run to run) were compared by shape, dtype, layout and device only. "
        f"{len(undeclared)} of the samples that ran are in a dtype the ModuleInfo does not "
        f"declare (bfloat16 for most modules). Not counted: {counts[CPU_ERROR]} samples that "
        f"raise on the CPU too (`cpu-error`) and {counts[NO_GRAD]} backward samples with nothing "
        "to differentiate (`no-grad`).",
        "",
    ]
    out += _method()
    out += sections.failures_section(results, KNOWN_CAUSES, "modules")
    out += sections.unreproducible_section(results)
    out += _per_module(results, units, names, declared)
    out += sections.not_counted_section(
        results, "Not counted: samples that raise on the CPU, backward without grads", "modules"
    )
    return sections.write_text(out, path)
