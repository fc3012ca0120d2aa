"""python -m torchneuron.fit MODEL [options]: peak HBM per logical core on Trainium."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import PRESETS, Layout, StepSpec, estimate
from .report import format_html, format_text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m torchneuron.fit", description=__doc__)
    p.add_argument("model", help=f"preset ({', '.join(PRESETS)}), config.json or checkpoint dir")
    p.add_argument("--batch", type=int, default=1, help="micro-batch per data-parallel replica")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--inference", action="store_true", help="prefill + decode with a KV cache")
    p.add_argument("--new-tokens", type=int, default=1)
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="bf16")
    p.add_argument("--autocast", action="store_true", help="bf16 autocast around the forward")
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    p.add_argument("--grad-checkpointing", action="store_true")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--fsdp", type=int, default=1)
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--chip", action="append", help="trn1, trn2, trn2:1, trn3 ... (repeatable)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--html", type=Path, help="also write a self-contained HTML report here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    try:
        spec = StepSpec(
            batch=a.batch,
            seq=a.seq,
            training=not a.inference,
            dtype=a.dtype,
            autocast=a.autocast,
            optimizer=a.optimizer,
            grad_checkpointing=a.grad_checkpointing,
            new_tokens=a.new_tokens,
        )
        report = estimate(a.model, spec, Layout(a.tp, a.fsdp, a.dp), a.chip)
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
