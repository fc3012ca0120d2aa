"""The fit report as text and as self-contained HTML."""

from __future__ import annotations

from ..html_report import gib, page, polyline, stacked_bars, table
from . import FitReport
from .trace import CATEGORIES


def _label(category: str) -> str:
    return category.replace("_", " ")


def format_text(report: FitReport) -> str:
    spec = report.trace.spec
    kind = (
        "training" if spec.training else f"inference (+{spec.new_tokens} tokens, static KV cache)"
    )
    lines = [
        f"{report.model}: {kind}, batch {spec.batch} x seq {spec.seq}, {spec.dtype}"
        + (" + bf16 autocast" if spec.autocast else "")
        + (f", {spec.optimizer}" if spec.training else "")
        + (", gradient checkpointing" if spec.grad_checkpointing else ""),
        f"layout {report.layout}; single-device peak {gib(report.trace.peak_bytes)}",
        (
            "traced on a fake process group: "
            + ", ".join(f"rank {r} {gib(t.peak_bytes)}" for r, t in report.traced_ranks.items())
            if report.traced_ranks
            else "rescaled from the single-device trace"
        ),
        "",
        f"{'target':<16}{'peak/core':>12}{'capacity':>12}  fits  "
        + "".join(f"{_label(c)[:12]:>13}" for c in CATEGORIES),
    ]
    for f in report.fits:
        lines.append(
            f"{f.target.name:<16}{gib(f.peak_bytes):>12}{gib(f.target.hbm_bytes):>12}  "
            f"{'yes ' if f.fits else 'NO  '}  "
            + "".join(f"{gib(f.breakdown[c]):>13}" for c in CATEGORIES)
        )
    lines.append("")
    lines.append("smallest layout that fits (fewest logical cores, then least tp):")
    for name, best in report.smallest.items():
        lines.append(
            f"  {name:<16}"
            + (f"{best.layout}  peak {gib(best.peak_bytes)}" if best else "none up to the limit")
        )
    return "\n".join(lines)


def format_html(report: FitReport) -> str:
    rows = [
        (
            f.target.name,
            [(_label(c), float(f.breakdown[c])) for c in CATEGORIES],
            f.target.hbm_bytes,
        )
        for f in report.fits
    ]
    smallest_rows = [
        (name, str(best.layout) if best else "none", gib(best.peak_bytes) if best else "-")
        for name, best in report.smallest.items()
    ]
    timeline = polyline(
        [(float(i), float(b)) for i, b in report.trace.timeline], y_label="live bytes, one device"
    )
    return page(
        f"Memory fit: {report.model}",
        [
            ("Step", f"<pre>{format_text(report)}</pre>"),
            (f"Peak HBM per logical core, layout {report.layout}", stacked_bars(rows)),
            ("Smallest layout that fits", table(("target", "layout", "peak/core"), smallest_rows)),
            ("Live bytes over the traced step (single device, whole model)", timeline),
        ],
    )
