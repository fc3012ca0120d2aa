"""python -m torchneuron.fidelity.ls: chips, logical cores and memory, like neuron-ls."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def devices() -> list[dict[str, Any]]:
    """One entry per logical core (torch device) of this process's topology."""
    import torch

    from .. import _C

    torch.neuron.init()
    out = []
    for index in range(int(_C._device_count())):
        props = dict(_C._get_device_properties(index))
        free, total = _C._mem_get_info(index)
        props.update(index=index, free=int(free), capacity=int(total))
        out.append(props)
    return out


def format_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no neuron devices"
    chip = rows[0]["chip"]
    head = (
        f"instance: software NeuronCore runtime, {chip}, "
        f"LNC={rows[0]['logical_nc_config']}, {len(rows)} logical cores"
    )
    lines = [
        head,
        f"{'DEVICE':>6} {'CHIP':>5} {'PHYS CORES':>11} {'HBM/CORE':>10} "
        f"{'ALLOCATABLE':>12} {'FREE':>10}  NAME",
    ]
    for r in rows:
        first = r["physical_core_first"]
        cores = f"{first}-{first + r['logical_nc_config'] - 1}"
        lines.append(
            f"{r['index']:>6} {r['chip_index']:>5} {cores:>11} {_gib(r['hbm_bytes']):>10} "
            f"{_gib(r['capacity']):>12} {_gib(r['free']):>10}  {r['name']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchneuron.fidelity.ls", description=__doc__)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    try:
        rows = devices()
    except RuntimeError as error:  # a configuration error names the variable to fix
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(json.dumps(rows, indent=1) if a.json else format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
