"""python -m torchneuron.fidelity.top: per-core memory and op rate of running processes, like
neuron-top.

Reads the stats files processes publish (``TORCHNEURON_STATS=1``, see stats_publisher.py);
the op rate is the difference of two readings ``--interval`` seconds apart.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from ..device.stats_publisher import stats_dir


def read_all(directory: Path | None = None) -> dict[int, dict[str, Any]]:
    """pid -> its latest snapshot, for live processes only (stale files are skipped)."""
    directory = directory or stats_dir()
    found: dict[int, dict[str, Any]] = {}
    if not directory.is_dir():
        return found
    for path in directory.glob("*.json"):
        try:
            pid = int(path.stem)
            os.kill(pid, 0)  # alive?
            found[pid] = json.loads(path.read_text())
        except (ValueError, ProcessLookupError, PermissionError, OSError, json.JSONDecodeError):
            continue
    return found


def rows(
    before: dict[int, dict[str, Any]], after: dict[int, dict[str, Any]]
) -> list[dict[str, Any]]:
    out = []
    for pid, snap in sorted(after.items()):
        prev = before.get(pid)
        rate = 0.0
        if prev is not None and snap["time"] > prev["time"]:
            rate = (snap["ops"] - prev["ops"]) / (snap["time"] - prev["time"])
        for dev in snap["devices"]:
            out.append(
                {
                    "pid": pid,
                    "command": snap["command"],
                    "device": dev["index"],
                    "allocated": dev["allocated"],
                    "reserved": dev["reserved"],
                    "peak": dev["peak"],
                    "capacity": dev["capacity"],
                    "ops_per_s": rate,
                }
            )
    return out


def format_table(table: list[dict[str, Any]]) -> str:
    mib = 1 << 20
    lines = [
        f"{'PID':>8} {'DEV':>4} {'ALLOC MiB':>10} {'RESERVED':>10} {'PEAK':>10} "
        f"{'USE':>6} {'OPS/S':>9}  COMMAND"
    ]
    for r in table:
        use = r["allocated"] / r["capacity"] if r["capacity"] else 0.0
        lines.append(
            f"{r['pid']:>8} {r['device']:>4} {r['allocated'] / mib:>10.1f} "
            f"{r['reserved'] / mib:>10.1f} {r['peak'] / mib:>10.1f} {use:>6.1%} "
            f"{r['ops_per_s']:>9.0f}  {r['command'][:50]}"
        )
    if not table:
        lines.append("(no process publishes stats: run it with TORCHNEURON_STATS=1)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m torchneuron.fidelity.top", description=__doc__)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--once", action="store_true", help="print one table and exit")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    before = read_all()
    while True:
        time.sleep(a.interval)
        after = read_all()
        table = rows(before, after)
        text = json.dumps(table) if a.json else format_table(table)
        if a.once:
            print(text)
            return 0
        print("\033[2J\033[H" + text, flush=True)
        before = after


if __name__ == "__main__":
    sys.exit(main())
