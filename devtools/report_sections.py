"""The parts of the conformance reports (op_coverage, module_coverage) that are the same:
the summary table, failures grouped by known cause, the samples not counted, table cells."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path

from devtools.conformance import (
    COUNTED,
    CPU_ERROR,
    ERROR,
    FAIL,
    NO_GRAD,
    PASS,
    UNREPRODUCIBLE,
    Result,
)

# A known cause: (regex over the op/module name, regex searched in the reason, the cause).
Cause = tuple[str, str, str]


def counts(results: Iterable[Result]) -> Counter[str]:
    return Counter(r.status for r in results)


def percent(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.2f}%" if whole else "n/a"


def md(text: str) -> str:
    """`text` safe inside a markdown table cell or code span."""
    return text.replace("|", "\\|").replace("\n", " ").replace("`", "'")


def summary_rows(
    results: list[Result], groups: list[tuple[str, Callable[[Result], bool]]], target: float
) -> list[str]:
    """The summary table: a row per (label, which results) with the pass rate against
    `target` (a fraction) of the samples that ran on the CPU."""
    rows = [
        f"| | samples run on CPU | pass | fail | error | pass rate | target {100 * target:g}% |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for label, selected in groups:
        c = counts(r for r in results if selected(r))
        counted = sum(c[s] for s in COUNTED)
        rate = c[PASS] / counted if counted else 0.0
        met = "met" if rate >= target else f"missed by {100 * (target - rate):.2f} points"
        met = met if counted else "n/a"
        rows.append(
            f"| {label} | {counted} | {c[PASS]} | {c[FAIL]} | {c[ERROR]} | "
            f"{percent(c[PASS], counted)} | {met} |"
        )
    return rows


def matches(r: Result, op_pattern: str, reason_pattern: str) -> bool:
    return bool(re.fullmatch(op_pattern, r.op)) and bool(re.search(reason_pattern, r.reason))


def cause_of(r: Result, known: list[Cause]) -> str:
    """The known cause of a non-pass, or 'unexplained: <reason>'."""
    for op_pattern, reason_pattern, cause in known:
        if matches(r, op_pattern, reason_pattern):
            return cause
    return "unexplained: " + reason_group(r)


# Where in a result a mismatch is ('output[0]: ', "grad['weight']: "): dropped to group reasons.
_WHERE = re.compile(
    r"^(output|grad|buffers|parameters|inputs|input \d+ after the call: output)(\[[^\]]*\])*: "
)


def reason_group(r: Result) -> str:
    """The reason of a non-pass without the details that differ from sample to sample."""
    text = r.reason
    if r.status == FAIL:
        text = _WHERE.sub("", text)
        if "not close" in text:
            return "fail: values differ beyond tolerance"
        if "not equal" in text:
            return "fail: values differ (exact dtype)"
    text = re.sub(r"\d+", "N", text)
    return f"{r.status}: {text[:140]}"


def failures_section(results: list[Result], known: list[Cause], what: str) -> list[str]:
    """'Failures and errors': a table by cause, then every failing sample. `what` names the
    things run ('ops', 'modules') in the table header."""
    non_pass = [r for r in results if r.status in (FAIL, ERROR)]
    out = [f"## Failures and errors ({len(non_pass)})", ""]
    if not non_pass:
        return [*out, "None.", ""]
    out += [
        "### By cause",
        "",
        "Causes come from `KNOWN_CAUSES` in the harness (each was reproduced by hand); a "
        "non-pass that matches none is listed as 'unexplained' with its reason.",
        "",
        f"| cause | samples | {what} (dtype mode) |",
        "|---|---:|---|",
    ]
    by_cause: dict[str, list[Result]] = defaultdict(list)
    for r in non_pass:
        by_cause[cause_of(r, known)].append(r)
    for cause, rs in sorted(by_cause.items(), key=lambda kv: -len(kv[1])):
        names = ", ".join(sorted({f"{r.op} ({r.dtype} {r.mode})" for r in rs}))
        out.append(f"| {md(cause)} | {len(rs)} | {md(names)} |")
    out += ["", "### Every failing sample", ""]
    for r in non_pass:
        cause = next((c for o, x, c in known if matches(r, o, x)), None)
        label = f" [{cause.split(':')[0]}]" if cause else ""
        out.append(
            f"- `{r.op}` {r.dtype} {r.mode} sample {r.index}: **{r.status}**{label}: "
            f"{md(r.reason)}" + (f" — sample: `{md(r.sample)}`" if r.sample else "")
        )
    return [*out, ""]


def unreproducible_section(results: list[Result]) -> list[str]:
    unreproducible = [r for r in results if r.checked == UNREPRODUCIBLE]
    out = [f"## Compared by metadata only: CPU not reproducible ({len(unreproducible)})", ""]
    if not unreproducible:
        out.append("None.")
    for r in unreproducible:
        out.append(f"- `{r.op}` {r.dtype} {r.mode} sample {r.index}: `{md(r.sample)}`")
    return [*out, ""]


def not_counted_section(results: list[Result], title: str, what: str) -> list[str]:
    """The cpu-error and no-grad samples, grouped by reason."""
    skipped = [r for r in results if r.status in (CPU_ERROR, NO_GRAD)]
    out = [f"## {title} ({len(skipped)})", ""]
    grouped: dict[str, list[Result]] = defaultdict(list)
    for r in skipped:
        grouped[f"{r.status}: {r.reason[:120]}"].append(r)
    if not grouped:
        return [*out, "None.", ""]
    out += [f"| reason | samples | {what} |", "|---|---:|---|"]
    for reason, rs in sorted(grouped.items(), key=lambda kv: -len(kv[1])):
        names = ", ".join(sorted({f"{r.op} ({r.dtype} {r.mode})" for r in rs}))
        out.append(f"| {md(reason)} | {len(rs)} | {md(names)} |")
    return [*out, ""]


def cell(results: list[Result]) -> str:
    """A table cell: pass/fail/error (bold when any fail or error), then the samples not
    counted (`+N cpu`, `+N no-grad`)."""
    c = counts(results)
    text = f"{c[PASS]}/{c[FAIL]}/{c[ERROR]}"
    if c[FAIL] or c[ERROR]:
        text = f"**{text}**"
    if c[CPU_ERROR]:
        text += f" +{c[CPU_ERROR]} cpu"
    if c[NO_GRAD]:
        text += f" +{c[NO_GRAD]} no-grad"
    return text


def write_text(lines: list[str], path: Path | None) -> str:
    """The report's text, written to `path` if given."""
    text = "\n".join(lines)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return text


def quoted_summary(report: Path) -> list[str]:
    """The summary table of another generated report (e.g. module_coverage.md), so that one
    report also states the other's figures; empty if that report was never generated."""
    if not report.exists():
        return []
    lines = report.read_text().splitlines()
    try:
        start = lines.index("## Summary") + 1
    except ValueError:
        return []
    table = []
    for line in lines[start:]:
        if table and not line.startswith("|"):
            break
        if line.startswith("|"):
            table.append(line)
    return table
