"""Fuzzing of torchneuron's public entry points with hypothesis.

``python -m devtools.fuzz --examples N`` runs every target with up to N generated
cases each (derandomized: the same N give the same cases) and prints, per entry point, the
number of cases run and what was found. Targets run in-process (one per child process, so
a crash or hang of one is reported as such: the child prints each case before running it,
and the last case printed is the culprit) except those that start processes themselves
(the environment variables: one interpreter per case; the collectives: two ranks).
``--target NAME`` runs one target in this process (what each child does), ``--list``
names them. Exit status 1 when anything was found.

The oracle is in fuzz_oracle.py; tests/test_fuzz.py runs a bounded number of cases of each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from .checkout import child_environment
from .fuzz_target import TargetReport, settings_for

CASE_MARK = "FUZZ-CASE "
RESULT_MARK = "FUZZ-RESULT "


def _targets() -> dict[str, tuple[Any, Callable[[Any], None]]]:
    if os.environ.get("TORCHNEURON_FUZZ_SELFTEST") == "1":
        return _self_test_targets()  # only these (and no torch import: a fast child)
    # Imported when asked for, for the same reason.
    from .fuzz_api import device_api_targets
    from .fuzz_compile import compile_targets
    from .fuzz_tensors import tensor_targets

    return {**device_api_targets(), **tensor_targets(), **compile_targets()}


def _self_test_targets() -> dict[str, tuple[Any, Callable[[Any], None]]]:
    """Targets that crash, hang or find something on purpose: tests of the harness itself."""
    from hypothesis import strategies as st

    from .fuzz_oracle import Finding

    def abort_on_large(case: int) -> None:
        if case >= 5:
            os.abort()

    def hang_on_large(case: int) -> None:
        if case >= 5:
            time.sleep(3600)

    def wrong_on_large(case: int) -> None:
        if case >= 5:
            raise Finding(f"{case} is wrong")

    cases = st.integers(0, 100)
    return {
        "self-test: abort": (cases, abort_on_large),
        "self-test: hang": (cases, hang_on_large),
        "self-test: finding": (cases, wrong_on_large),
    }


def _process_targets() -> dict[str, Callable[[int, bool], TargetReport]]:
    # Imported when asked for: they import torch, which the self-test child must not pay for.
    from .fuzz_collectives import run_collectives
    from .fuzz_env import run_environment

    return {
        "environment variables": run_environment,
        "collectives (2 ranks)": run_collectives,
    }


def target_names() -> list[str]:
    return [*_targets(), *_process_targets()]


def run_in_process(name: str, examples: int, verbose: bool = False) -> TargetReport:
    """Runs target `name` in this process; a failing case is shrunk and reported."""
    import warnings

    from hypothesis import given

    warnings.simplefilter("ignore")  # dtype warnings (ComplexHalf, casts) would flood the log
    strategy, check = _targets()[name]
    report = TargetReport(name)
    started = time.monotonic()
    last_case: list[Any] = [None]

    @settings_for(examples)
    @given(strategy)
    def property_(case: Any) -> None:
        report.cases += 1
        last_case[0] = case
        if verbose:
            print(f"{CASE_MARK}[{name}] {case!r}"[:500], flush=True)
        check(case)

    try:
        property_()
    except Exception as error:  # noqa: BLE001 - the finding, with its minimal case
        # hypothesis runs the minimal failing case last
        report.findings.append(
            f"{type(error).__name__}: {error}"[:2000] + f"\n  case: {last_case[0]!r}"
        )
    report.seconds = time.monotonic() - started
    return report


# Relative cost of a case: --examples N runs N cases of the cheap targets and N // cost of
# the others (a compile is ~1 s, an environment case starts an interpreter).
COST = {"torch.compile backend=neuron": 10, "environment variables": 20, "collectives (2 ranks)": 4}


def examples_for(name: str, examples: int) -> int:
    return max(1, examples // COST.get(name, 1))


def run_isolated(counts: dict[str, int], timeout: float) -> list[TargetReport]:
    """Runs in-process targets (name -> cases) in one child interpreter, the others as they
    run; a crash or hang of the child is a finding of the target it was running."""
    reports = [
        _process_targets()[n](c, False) for n, c in counts.items() if n in _process_targets()
    ]
    in_process = {n: c for n, c in counts.items() if n in _targets()}
    if not in_process:
        return reports
    started = time.monotonic()
    command = [sys.executable, "-X", "faulthandler", "-m", "devtools.fuzz", "--child",
               "--verbose", "--timeout", str(timeout)]  # fmt: skip
    for name, count in in_process.items():
        command += ["--target", f"{name}={count}"]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, env=child_environment()
        )
        out, err, code = done.stdout, done.stderr, done.returncode
    except subprocess.TimeoutExpired as expired:
        out = expired.stdout.decode() if isinstance(expired.stdout, bytes) else expired.stdout
        err, code = "", None
    lines = (out or "").splitlines()
    finished = {}
    for line in lines:
        if line.startswith(RESULT_MARK):
            data = json.loads(line[len(RESULT_MARK) :])
            finished[data["name"]] = TargetReport(**data)
    for name in in_process:
        if name in finished:
            reports.append(finished[name])
            continue
        mine = [ln for ln in lines if ln.startswith(f"{CASE_MARK}[{name}] ")]
        last = mine[-1].split("] ", 1)[1] if mine else "(before its first case)"
        what = f"hung (killed after {timeout:.0f} s)" if code is None else f"crashed (exit {code})"
        tail = "\n".join((err or "").splitlines()[-15:])
        finding = f"{what} on case {last}\n{tail}" if mine else f"not run: the child {what}"
        reports.append(TargetReport(name, len(mine), [finding], time.monotonic() - started))
    return reports


def _parse_target(text: str, examples: int) -> tuple[str, int]:
    name, _, count = text.rpartition("=")
    if name and count.isdigit():
        return name, int(count)
    return text, examples_for(text, examples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=200,
                        help="cases per target (a compile target runs N/10, the environment "
                             "N/20, the collectives N/4)")  # fmt: skip
    parser.add_argument("--target", action="append", help="NAME or NAME=CASES (repeatable)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds for the run")
    parser.add_argument("--list", action="store_true", help="print the target names")
    parser.add_argument("--verbose", action="store_true", help="print each case as it runs")
    parser.add_argument("--json", action="store_true", help="print the reports as JSON")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(target_names()))
        return 0
    counts = dict(_parse_target(t, args.examples) for t in args.target or target_names())
    unknown = sorted(set(counts) - set(target_names()))
    if unknown:
        parser.error(f"unknown targets {unknown}; --list names them")
    if args.child:  # run here, one JSON line per target
        failed = False
        for name, count in counts.items():
            report = run_in_process(name, count, args.verbose)
            print(RESULT_MARK + json.dumps(report.__dict__), flush=True)
            failed |= bool(report.findings)
        return 1 if failed else 0
    reports = run_isolated(counts, args.timeout)
    if args.json:
        print(json.dumps([r.__dict__ for r in reports]))
    else:
        print(f"{'entry point':<40} {'cases':>6} {'s':>6}  findings")
        for r in reports:
            print(f"{r.name:<40} {r.cases:>6} {r.seconds:>6.1f}  {len(r.findings)}")
        for r in reports:
            for finding in r.findings:
                print(f"\n[{r.name}] {finding}")
    return 1 if any(r.findings for r in reports) else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
