"""python -m torchneuron.fidelity.compile_audit [--json] script.py [args]: graphs compiled on
neuron."""

from __future__ import annotations

import argparse
import runpy
import sys

from . import audit


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m torchneuron.fidelity.compile_audit", description=__doc__
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("--multiple", type=int, default=128, help="bucket granularity (default 128)")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    saved = sys.argv
    sys.argv = [a.script, *a.args]
    code = 0
    with audit(a.multiple) as result:
        try:
            runpy.run_path(a.script, run_name="__main__")
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        finally:
            sys.argv = saved
    print(
        result.to_json() if a.json else result.format(),
        file=sys.stderr if not a.json else sys.stdout,
    )
    return code


if __name__ == "__main__":
    sys.exit(main())
