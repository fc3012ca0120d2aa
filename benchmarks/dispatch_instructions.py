"""Instructions per call of tiny ops on neuron against CPU eager, counted by callgrind.

Timing tiny ops on a shared 2-core host moves by ±15% between runs; instruction counts do
not. This command runs every op of benchmarks/eager_dispatch.py's tiny list (4x4 and
8-element tensors, where the whole cost is framework overhead) on CPU and on neuron in one
process under ``valgrind --tool=callgrind``, and reports instructions per call on the calling
thread and their ratio (target: neuron <= 1.1x CPU). It also times the same calls without
valgrind (interleaved blocks, medians), so both figures come from one command.

How only the measured loops are counted: each loop runs as
``collections.deque(itertools.starmap(fn, itertools.repeat((), n)), maxlen=0)``, whose
iteration happens inside CPython's C function ``consume_iterator`` (used for nothing else
here). Callgrind collects only inside it (``--toggle-collect``) and writes one dump per loop
(``--dump-after``). Each op runs twice per device, with N1 and N2 calls; (I(N2) - I(N1)) /
(N2 - N1) cancels the loop's fixed cost. An empty call (``lambda: None``) measured the same
way gives the harness's own per-call cost, subtracted from both sides.

    python benchmarks/dispatch_instructions.py                # counts + times (~3 min)
    python benchmarks/dispatch_instructions.py --no-time      # counts only
    python benchmarks/dispatch_instructions.py --ops add,mul --keep /tmp/cg
        # keep the dumps to read with callgrind_annotate (file order = loop order, printed)
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from _harness import Op, Table, fmt, gc_paused, host_banner, interleaved, print_table
from eager_dispatch import tiny_ops

TARGET = 1.1  # neuron instructions (and time) per call / CPU's, at most
N1, N2 = 20, 120  # calls per counted loop: the difference cancels fixed costs
WARMUP = 10
EMPTY = "(empty call)"


def run_loop(fn: Op, n: int) -> None:
    """n calls of fn, all inside CPython's consume_iterator (the callgrind marker)."""
    collections.deque(itertools.starmap(fn, itertools.repeat((), n)), maxlen=0)


def sync(device: str) -> None:
    if device == "neuron":
        torch.neuron.synchronize()


def newest_dump(workdir: Path) -> str:
    """The name of the last dump callgrind wrote (cg.out.<k>, k counting up)."""
    return max(workdir.glob("cg.out.*"), key=dump_index).name


def child(plan_path: Path, names: list[str]) -> None:
    """Runs under callgrind: every counted loop, with the dump it produced, in plan_path.

    Other code (imports) runs consume_iterator too, so each loop's dump is found by name
    right after the loop: callgrind writes it before the loop returns."""
    torch.set_num_threads(1)
    ops = {device: tiny_ops(device) for device in ("cpu", "neuron")}
    plan = []
    with gc_paused():
        for name in [EMPTY, *names]:
            for device in ("cpu", "neuron"):
                fn: Op = (lambda: None) if name == EMPTY else ops[device][name][1]
                for _ in range(WARMUP):
                    fn()
                sync(device)
                for n in (N1, N2):
                    run_loop(fn, n)  # one callgrind dump each
                    dump = newest_dump(plan_path.parent)
                    plan.append({"op": name, "device": device, "n": n, "dump": dump})
                sync(device)
    plan_path.write_text(json.dumps(plan))


def total_instructions(dump: Path) -> int:
    """The Ir total of one callgrind dump."""
    text = dump.read_text(errors="replace")
    match = re.search(r"^(?:summary|totals):\s*(\d+)", text, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"no instruction total in callgrind dump {dump}")
    return int(match.group(1))


def dump_index(path: Path) -> int:
    return int(path.name.rsplit(".", 1)[1])


def count_instructions(names: list[str], keep: Path | None) -> dict[tuple[str, str], float]:
    """(op, device) -> instructions per call, harness cost not yet subtracted."""
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    workdir = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="dispatch_cg_"))
    workdir.mkdir(parents=True, exist_ok=True)
    for old in workdir.glob("cg.out*"):
        old.unlink()
    plan_path = workdir / "plan.json"
    command = [
        "valgrind",
        "--tool=callgrind",
        "--collect-atstart=no",
        "--toggle-collect=consume_iterator",
        "--dump-after=consume_iterator",
        f"--callgrind-out-file={workdir}/cg.out",
        sys.executable,
        __file__,
        "--child",
        str(plan_path),
        "--ops",
        ",".join(names),
    ]
    print(f"counting under callgrind (a few minutes): {' '.join(command[:5])} ...", flush=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"callgrind run failed with exit code {done.returncode}")
    plan = json.loads(plan_path.read_text())
    dumps = [workdir / step["dump"] for step in plan]
    if len(set(dumps)) != len(plan):
        raise SystemExit(f"two counted loops share a callgrind dump in {workdir}")
    counts: dict[tuple[str, str, int], int] = {}
    for step, dump in zip(plan, dumps, strict=True):
        counts[(step["op"], step["device"], step["n"])] = total_instructions(dump)
    if keep:
        lines = [
            f"{d.name}: {s['op']} on {s['device']}, n={s['n']}"
            for s, d in zip(plan, dumps, strict=True)
        ]
        (workdir / "index.txt").write_text("\n".join(lines) + "\n")
        print(f"callgrind dumps kept in {workdir} (index.txt names them)")
    else:
        shutil.rmtree(workdir)
    per_call = {}
    for op, device, n in counts:
        if n == N2:
            per_call[(op, device)] = (counts[(op, device, N2)] - counts[(op, device, N1)]) / (
                N2 - N1
            )
    return per_call


def time_per_call(names: list[str], quick: bool) -> dict[tuple[str, str], float]:
    """(op, device) -> seconds per call, from interleaved blocks (medians)."""
    ops = {device: tiny_ops(device) for device in ("cpu", "neuron")}
    iterations, rounds = (1000, 7) if quick else (3000, 15)
    result = {}
    with gc_paused():
        for name in names:
            fns = {"cpu": ops["cpu"][name][1], "neuron": ops["neuron"][name][1]}
            t = interleaved(fns, iterations, rounds)
            result[(name, "cpu")], result[(name, "neuron")] = t["cpu"], t["neuron"]
    return result


@dataclass
class Row:
    op: str
    size: str
    cpu_ir: float
    neuron_ir: float
    cpu_s: float | None
    neuron_s: float | None

    @property
    def ir_ratio(self) -> float:
        return self.neuron_ir / self.cpu_ir

    @property
    def time_ratio(self) -> float | None:
        return None if self.cpu_s is None or self.neuron_s is None else self.neuron_s / self.cpu_s


def table(rows: list[Row]) -> Table:
    header = ["op", "size", "cpu Ir/call", "neuron Ir/call", "Ir ratio", "cpu µs", "neuron µs"]
    header += ["time ratio", f"Ir <= {TARGET}"]
    body = []
    for r in rows:
        tr = r.time_ratio
        body.append(
            [
                r.op,
                r.size,
                f"{r.cpu_ir:.0f}",
                f"{r.neuron_ir:.0f}",
                f"{r.ir_ratio:.3f}",
                "-" if r.cpu_s is None else fmt(r.cpu_s * 1e6),
                "-" if r.neuron_s is None else fmt(r.neuron_s * 1e6),
                "-" if tr is None else f"{tr:.3f}",
                "pass" if r.ir_ratio <= TARGET else "MISS",
            ]
        )
    return Table(header, body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", help="comma-separated op names (default: all)")
    parser.add_argument("--no-time", action="store_true", help="instruction counts only")
    parser.add_argument("--quick", action="store_true", help="fewer timing rounds")
    parser.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    parser.add_argument("--keep", help="directory to keep the callgrind dumps in")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    all_ops = tiny_ops("cpu")
    names = args.ops.split(",") if args.ops else list(all_ops)
    unknown = [n for n in names if n not in all_ops]
    if unknown:
        parser.error(f"unknown ops {unknown}; known: {', '.join(all_ops)}")
    if args.child:
        child(Path(args.child), names)
        return 0
    if not torch.neuron.is_available():
        print("no neuron device available", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    import torchneuron

    print(host_banner())
    print(f"CPU model and ISA: {torchneuron._C._kernel_isa()}", flush=True)
    per_call = count_instructions(names, Path(args.keep) if args.keep else None)
    harness = {device: per_call[(EMPTY, device)] for device in ("cpu", "neuron")}
    print(
        f"harness cost per call (subtracted): cpu {harness['cpu']:.0f}, "
        f"neuron {harness['neuron']:.0f} instructions"
    )
    times = {} if args.no_time else time_per_call(names, args.quick)
    rows = [
        Row(
            name,
            all_ops[name][0],
            per_call[(name, "cpu")] - harness["cpu"],
            per_call[(name, "neuron")] - harness["neuron"],
            times.get((name, "cpu")),
            times.get((name, "neuron")),
        )
        for name in names
    ]
    print_table(table(rows), args.markdown)
    passed = sum(r.ir_ratio <= TARGET for r in rows)
    total_cpu = sum(r.cpu_ir for r in rows)
    total_neuron = sum(r.neuron_ir for r in rows)
    print()
    print(
        f"{passed}/{len(rows)} within {TARGET}x in instructions; all ops together "
        f"{total_neuron / total_cpu:.3f}x; load average {os.getloadavg()[0]:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
