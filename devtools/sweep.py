"""How the conformance harnesses (op_coverage, module_coverage) run: units in worker
processes with a per-sample timeout (a crash or a hang costs one sample, not the sweep),
the build and commit they ran, and the command line they share (``main``).

A harness (``Harness``) provides ``check_unit(unit, start, phase)`` (its samples from index
`start`, calling ``phase(index, name)`` as it goes: a crash during "cpu" is the CPU's, not
counted); ``sweep`` starts ``python -m <harness module> --worker`` processes, which run
``worker_main``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from devtools.checkout import ROOT, child_environment
from devtools.conformance import (
    CPU_ERROR,
    ERROR,
    FAIL,
    Result,
    Unit,
)

CheckUnit = Callable[[Unit, int, Callable[[int, str], None] | None], Iterator[Result]]


# ---------------------------------------------------------------------------------------------
# What ran


def build_id() -> str:
    """Which build of the backend this process runs: the extension's file and its mtime."""
    from torchneuron import _C

    path = Path(_C.__file__)
    built = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(path.stat().st_mtime))
    return f"{path.name} built {built} UTC"


def source_state() -> str:
    """The git commit of the checkout and whether csrc/ has uncommitted changes."""
    root = ROOT

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30
        )
        return done.stdout.strip() if done.returncode == 0 else ""

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--", "csrc")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    if not head:
        return "unknown"
    return f"commit {head}" + (" with uncommitted changes in csrc/" if dirty else "")


# ---------------------------------------------------------------------------------------------
# Worker processes


def worker_main(prepare: Callable[[], Any], check_unit: CheckUnit) -> None:
    """Reads units (JSON lines) on stdin; writes progress and results on the original stdout.
    Anything else the samples print goes to stderr."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    prepare()

    def send(message: dict[str, Any]) -> None:
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    send({"t": "ready", "build": build_id()})
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        unit = Unit(request["op"], request["dtype"], request["mode"])
        for result in check_unit(
            unit, request["start"], lambda i, p: send({"t": "p", "i": i, "p": p})
        ):
            send({"t": "r", "r": dataclasses.asdict(result)})
        send({"t": "end"})


class _Process:
    """One worker process: its pipes, a thread reading its messages, and its stderr log."""

    def __init__(self, harness: str) -> None:
        self.harness = harness
        self.log = tempfile.NamedTemporaryFile(
            prefix=f"{harness.rsplit('.', 1)[-1]}_worker_", suffix=".log", delete=False
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.ready = False
        self.build = "unknown"
        self.popen = subprocess.Popen(
            [sys.executable, "-m", harness, "--worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            bufsize=1,
            env=child_environment(PYTHONUNBUFFERED="1"),
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next(self, timeout: float) -> dict[str, Any] | None:
        """The next message; None on EOF; raises TimeoutError."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError from None
        return None if line is None else json.loads(line)

    def wait_ready(self, timeout: float) -> None:
        if not self.ready:
            message = self.next(timeout)
            if message is None or message.get("t") != "ready":
                raise RuntimeError(f"{self.harness} worker did not start: {self.stderr_tail()}")
            self.ready = True
            self.build = str(message.get("build", "unknown"))

    def send(self, message: dict[str, Any]) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(json.dumps(message) + "\n")
        self.popen.stdin.flush()

    def stderr_tail(self) -> str:
        try:
            text = Path(self.log.name).read_text(errors="replace")
        except OSError:
            return ""
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return lines[-1][:200] if lines else ""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def close(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()
        self.log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log.name)


class _WorkerDied(Exception):
    pass


class _Worker:
    """Runs units in a worker process, replaced after a crash or a timeout. After the first
    replacement a spare process is kept loading in the background, so a run of crashing
    samples does not wait for a fresh interpreter each time."""

    def __init__(self, harness: str, timeout: float, builds: set[str] | None = None) -> None:
        self.harness = harness
        self.timeout = timeout
        self.process: _Process | None = None
        self.spare: _Process | None = None
        self.replacements = 0
        self.builds = builds if builds is not None else set()

    def _start(self) -> None:
        if self.process is not None:
            self.process.close()
            self.replacements += 1
        self.process, self.spare = self.spare or _Process(self.harness), None
        self.process.wait_ready(max(self.timeout, 300.0))
        self.builds.add(self.process.build)
        if self.replacements:
            self.spare = _Process(self.harness)

    def close(self) -> None:
        for process in (self.process, self.spare):
            if process is not None:
                process.close()
        self.process = self.spare = None

    def run(self, unit: Unit) -> list[Result]:
        results: list[Result] = []
        start = 0
        while True:
            if self.process is None or not self.process.alive():
                self._start()
            assert self.process is not None
            process = self.process
            process.send({"op": unit.op, "dtype": unit.dtype, "mode": unit.mode, "start": start})
            index, current_phase = start, "generate"
            try:
                while True:
                    message = process.next(self.timeout)
                    if message is None:
                        code = process.popen.wait()
                        how = signal.Signals(-code).name if code < 0 else f"exit code {code}"
                        tail = process.stderr_tail()
                        tail = f": {tail}" if tail else ""
                        raise _WorkerDied(f"crashed ({how}) during {current_phase}{tail}")
                    if message["t"] == "p":
                        index, current_phase = message["i"], message["p"]
                    elif message["t"] == "r":
                        results.append(Result(**message["r"]))
                        index, current_phase = message["r"]["index"] + 1, "next"
                    elif message["t"] == "end":
                        return results
            except TimeoutError:
                process.popen.kill()
                process.popen.wait()
                reason = f"timeout: no result after {self.timeout:.0f} s (during {current_phase})"
            except _WorkerDied as died:
                reason = str(died)
            if current_phase in ("generate", "next"):
                # Sample generation itself died: record the unit and move on.
                status = CPU_ERROR if current_phase == "generate" else ERROR
                results.append(
                    Result(
                        unit.op,
                        unit.dtype,
                        unit.mode,
                        index if current_phase == "next" else -1,
                        status,
                        "worker " + reason,
                    )
                )
                if current_phase == "generate":
                    return results
            else:
                status = CPU_ERROR if current_phase == "cpu" else ERROR
                results.append(
                    Result(unit.op, unit.dtype, unit.mode, index, status, "worker " + reason)
                )
            start = index + 1


def sweep(
    units: list[Unit],
    harness: str,
    jobs: int = 1,
    timeout: float = 180.0,
    verbose: bool = True,
    builds: set[str] | None = None,
) -> list[Result]:
    """Runs `units` in `jobs` worker processes of the module `harness`; returns every
    sample's result. The builds of the backend the workers ran are added to `builds`."""
    pending: queue.Queue[tuple[int, Unit]] = queue.Queue()
    for item in enumerate(units):
        pending.put(item)
    collected: dict[int, list[Result]] = {}
    lock = threading.Lock()
    started = time.monotonic()

    def work() -> None:
        worker = _Worker(harness, timeout, builds)
        try:
            while True:
                try:
                    number, unit = pending.get_nowait()
                except queue.Empty:
                    return
                results = worker.run(unit)
                with lock:
                    collected[number] = results
                    if verbose:
                        counts = Counter(r.status for r in results)
                        text = " ".join(f"{k}={v}" for k, v in sorted(counts.items()))
                        elapsed = time.monotonic() - started
                        print(
                            f"[{len(collected)}/{len(units)} {elapsed:.0f}s] "
                            f"{unit.op} {unit.dtype} {unit.mode}: {text}",
                            file=sys.stderr,
                            flush=True,
                        )
        finally:
            worker.close()

    threads = [threading.Thread(target=work) for _ in range(max(1, jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [r for number in sorted(collected) for r in collected[number]]


# ---------------------------------------------------------------------------------------------
# Running a harness


@dataclasses.dataclass
class Run:
    """The results of a sweep and what ran them."""

    results: list[Result]
    elapsed: float
    source: str
    builds: set[str]

    @property
    def backend(self) -> str:
        text = f"{self.source}; extension {', '.join(sorted(self.builds)) or 'unknown'}"
        if len(self.builds) > 1:
            text += " (the backend was rebuilt during the run: the results mix these builds)"
        return text

    def save(self, path: Path) -> None:
        saved = {
            "elapsed": self.elapsed,
            "source": self.source,
            "builds": sorted(self.builds),
            "results": [dataclasses.asdict(r) for r in self.results],
        }
        path.write_text(json.dumps(saved, indent=0))

    @classmethod
    def load(cls, path: Path) -> Run:
        saved = json.loads(path.read_text())
        if isinstance(saved, list):  # results only
            saved = {"results": saved, "elapsed": 0.0}
        return cls(
            [Result(**r) for r in saved["results"]],
            float(saved["elapsed"]),
            saved.get("source", "unknown"),
            set(saved.get("builds", [])),
        )


@dataclasses.dataclass
class Harness:
    """What a harness is made of, for its command line (``main``)."""

    module: str  # the harness's module: workers run ``python -m <module> --worker``
    what: str  # what its database holds: "OpInfo", "ModuleInfo"
    option: str  # the option naming some of them: "ops", "modules"
    dtypes: list[str]
    report: str  # the --full report under docs/
    table: Callable[[], dict[str, Any]]  # name -> database entry, in database order
    fast: dict[str, tuple[str, ...]]  # the fast subset: name -> dtypes
    units_for: Callable[[Any, list[str] | None], list[Unit]]
    check_unit: CheckUnit
    write_report: Callable[[Run, list[Unit], Path | None, str, bool], str]
    summary: Callable[[list[Result]], list[str]]

    def select(self, full: bool, names: list[str] | None, dtypes: list[str] | None) -> list[Unit]:
        """The units of `names`, of everything (`full`), or of the fast subset."""
        table = self.table()
        if names:
            unknown = [n for n in names if n not in table]
            if unknown:
                raise SystemExit(f"unknown {self.what}(s): {', '.join(unknown)}")
            return [u for n in names for u in self.units_for(table[n], dtypes)]
        if full:
            return [u for entry in table.values() for u in self.units_for(entry, dtypes)]
        units = []
        for name, wanted in self.fast.items():
            selected = [d for d in wanted if dtypes is None or d in dtypes]
            units += self.units_for(table[name], selected)
        return units


def run_units(args: argparse.Namespace, units: list[Unit], harness: Harness) -> Run:
    """Runs `units` as the options say (workers, in process) or loads an earlier run."""
    if args.from_json is not None:
        return Run.load(args.from_json)
    started = time.monotonic()
    source, builds = source_state(), set()
    if args.in_process:
        results = [r for unit in units for r in harness.check_unit(unit, 0, None)]
        builds.add(build_id())
    else:
        results = sweep(units, harness.module, args.jobs, args.timeout, builds=builds)
    return Run(results, time.monotonic() - started, source, builds)


def main(harness: Harness, argv: list[str] | None = None) -> int:
    """The command line of a harness: runs the selected units, writes the report, prints
    the summary and every non-pass; exits 0 when everything passed."""
    parser = argparse.ArgumentParser(
        prog=f"python -m {harness.module}",
        description=f"Run PyTorch's {harness.what} samples on neuron and on the CPU and compare.",
    )
    parser.add_argument(
        "--full", action="store_true", help=f"every {harness.what} (default: the fast subset)"
    )
    parser.add_argument(f"--{harness.option}", help=f"comma-separated {harness.what} names")
    parser.add_argument("--dtypes", help=f"comma-separated subset of {','.join(harness.dtypes)}")
    parser.add_argument("--out", type=Path, help=f"markdown report (--full: docs/{harness.report})")
    parser.add_argument("--json", type=Path, help="also write every sample's result as JSON")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per sample")
    parser.add_argument("--in-process", action="store_true", help="no workers (debugging)")
    parser.add_argument(
        "--from-json",
        type=Path,
        help="rewrite the report from a --json file of an earlier run (same selection)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker_main(harness.table, harness.check_unit)
        return 0

    names = getattr(args, harness.option)
    dtypes = args.dtypes.split(",") if args.dtypes else None
    units = harness.select(args.full, names.split(",") if names else None, dtypes)
    run = run_units(args, units, harness)
    out = args.out
    if out is None and args.full:
        out = default_report_path(harness.report)
    command = f"python -m {harness.module}" + (" --full" if args.full else "")
    if names:
        command += f" --{harness.option} {names}"
    if args.dtypes:
        command += f" --dtypes {args.dtypes}"
    harness.write_report(run, units, out, command, args.full)
    if args.json is not None:
        run.save(args.json)
    print("\n".join(harness.summary(run.results)))
    print(f"ran on: {run.backend}")
    for r in run.results:
        if r.status in (FAIL, ERROR):
            print(r.line())
    if out is not None:
        print(f"report: {out}")
    c = Counter(r.status for r in run.results)
    return 0 if c[FAIL] == 0 and c[ERROR] == 0 else 1


def default_report_path(name: str) -> Path:
    """docs/<name> of the checkout, or <name> here when not run from one."""
    return (ROOT / "docs" / name) if (ROOT / "docs").is_dir() else Path(name)
