"""Fuzzing of torchneuron's public entry points with hypothesis.

``python -m torchneuron.tools.fuzz --examples N`` runs every target with up to N generated
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
from dataclasses import dataclass, field
from typing import Any

CASE_MARK = "FUZZ-CASE "
RESULT_MARK = "FUZZ-RESULT "


@dataclass
class TargetReport:
    name: str
    cases: int = 0
    findings: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _targets() -> dict[str, tuple[Any, Callable[[Any], None]]]:
    from .fuzz_api import device_api_targets
    from .fuzz_compile import compile_targets
    from .fuzz_tensors import tensor_targets

    return {**device_api_targets(), **tensor_targets(), **compile_targets()}


def _process_targets() -> dict[str, Callable[[int, bool], TargetReport]]:
    from .fuzz_collectives import run_collectives
    from .fuzz_env import run_environment

    return {
        "environment variables": run_environment,
        "collectives (2 ranks)": run_collectives,
    }


def target_names() -> list[str]:
    return [*_targets(), *_process_targets()]


def settings_for(examples: int, shrink: bool = True) -> Any:
    """The fixed profile: derandomized, no example database, no deadline. shrink=False where
    several processes must run the same cases in step (a shrinking process would diverge)."""
    from hypothesis import HealthCheck, Phase, settings

    return settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate, *([Phase.shrink] if shrink else [])],
        print_blob=False,
        report_multiple_bugs=False,
    )


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
            print(CASE_MARK + repr(case)[:400], flush=True)
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


def run_isolated(name: str, examples: int, timeout: float) -> TargetReport:
    """Runs an in-process target in a child interpreter; crashes and hangs become findings."""
    if name in _process_targets():
        return _process_targets()[name](examples, False)
    started = time.monotonic()
    command = [sys.executable, "-X", "faulthandler", "-m", "torchneuron.tools.fuzz",
               "--target", name, "--examples", str(examples), "--verbose"]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        out, err, code = done.stdout, done.stderr, done.returncode
    except subprocess.TimeoutExpired as expired:
        out = expired.stdout.decode() if isinstance(expired.stdout, bytes) else expired.stdout
        err, code = "", None
    for line in (out or "").splitlines():
        if line.startswith(RESULT_MARK):
            data = json.loads(line[len(RESULT_MARK) :])
            return TargetReport(name, data["cases"], data["findings"], time.monotonic() - started)
    cases = [line for line in (out or "").splitlines() if line.startswith(CASE_MARK)]
    last = cases[-1][len(CASE_MARK) :] if cases else "(before the first case)"
    what = f"hung (killed after {timeout:.0f} s)" if code is None else f"crashed (exit {code})"
    tail = "\n".join((err or "").splitlines()[-15:])
    return TargetReport(
        name, len(cases), [f"{what} on case {last}\n{tail}"], time.monotonic() - started
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=200, help="cases per target")
    parser.add_argument("--target", action="append", help="run only these targets")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per target")
    parser.add_argument("--list", action="store_true", help="print the target names")
    parser.add_argument("--verbose", action="store_true", help="print each case as it runs")
    parser.add_argument("--json", action="store_true", help="print the reports as JSON")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(target_names()))
        return 0
    names = args.target or target_names()
    unknown = sorted(set(names) - set(target_names()))
    if unknown:
        parser.error(f"unknown targets {unknown}; --list names them")
    if args.target and len(names) == 1 and names[0] in _targets():
        # A child (or a single in-process target): run here, report as one JSON line.
        report = run_in_process(names[0], args.examples, args.verbose)
        print(RESULT_MARK + json.dumps(report.__dict__), flush=True)
        return 1 if report.findings else 0
    reports = [run_isolated(name, args.examples, args.timeout) for name in names]
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
