"""python -m torchneuron.fidelity.projection MODEL [options]: projected step time, tokens/s, MFU."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..fit.arguments import add_step_arguments, layout, step_spec
from ..html_report import page, stacked_bars, table
from . import Projection, project_step


def format_text(rows: list[Projection], top: int = 8) -> str:
    lines = [f"{'target':<16}{'step s':>10}{'compute':>10}{'comms':>10}{'tokens/s':>12}{'MFU':>7}"]
    for p in rows:
        lines.append(
            f"{p.target.name:<16}{p.step_seconds:>10.4f}{p.compute_seconds:>10.4f}"
            f"{p.collective_seconds:>10.4f}{p.tokens_per_second:>12.1f}{p.mfu:>7.1%}"
        )
    if rows:
        lines.append(f"slowest ops on {rows[0].target.name}:")
        for o in rows[0].ops[:top]:
            lines.append(f"  {o.name:<40}{o.seconds * 1e3:>10.3f} ms  {o.bound}-bound")
    return "\n".join(lines)


def format_html(rows: list[Projection]) -> str:
    bars = [
        (
            p.target.name,
            [("compute", p.compute_seconds), ("collectives", p.collective_seconds)],
            0.0,
        )
        for p in rows
    ]
    ops = rows[0].ops[:15] if rows else []
    return page(
        "Projected step time",
        [
            ("Summary", f"<pre>{format_text(rows)}</pre>"),
            ("Step time (s)", stacked_bars(bars, unit="s", scale=1.0)),
            (
                "Slowest ops",
                table(
                    ("op", "ms", "bound"),
                    [(o.name, f"{o.seconds * 1e3:.3f}", o.bound) for o in ops],
                ),
            ),
        ],
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m torchneuron.fidelity.projection", description=__doc__
    )
    add_step_arguments(p, dtypes=("fp32", "bf16"), optimizer=False)
    p.add_argument("--html", type=Path)
    a = p.parse_args(argv)
    try:
        rows = project_step(a.model, step_spec(a), layout(a), a.chip)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(format_text(rows))
    if a.html:
        a.html.write_text(format_html(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
