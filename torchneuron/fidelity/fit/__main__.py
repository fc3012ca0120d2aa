"""python -m torchneuron.fidelity.fit MODEL [options]: peak HBM per logical core on Trainium."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import estimate
from .arguments import add_step_arguments, layout, step_spec
from .layout import Layout
from .report import format_html, format_text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m torchneuron.fidelity.fit", description=__doc__)
    add_step_arguments(p)
    p.add_argument("--pp", type=int, default=1, help="pipeline stages (with --traced)")
    p.add_argument(
        "--traced",
        action="store_true",
        help="trace the layout (FSDP2, TP, DDP, pipeline stages on a fake process group) "
        "instead of rescaling the single-device trace",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--html", type=Path, help="also write a self-contained HTML report here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    try:
        if a.pp > 1 and not a.traced:
            raise ValueError("--pp needs --traced: pipeline layouts are not rescaled")
        chosen = layout(a)
        chosen = Layout(chosen.tp, chosen.fsdp, chosen.dp, a.pp)
        report = estimate(a.model, step_spec(a), chosen, a.chip, traced=a.traced)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(report.as_dict(), indent=1) if a.json else format_text(report))
    if a.html:
        a.html.write_text(format_html(report))
        print(f"wrote {a.html}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
