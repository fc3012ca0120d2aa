"""Where the test suite's CPU goes, per test: a pytest plugin and its report.

On two cores the suite is CPU-bound (its passes keep both busy), so its wall time is its CPU
time over two; a test's wall time under load says little, its CPU time says what it costs.
The plugin records, per test, the wall time, the worker's own CPU time and the CPU time of
the processes the test started and reaped (ranks, subprocesses, compilers)::

    python -m pytest tests -n 2 -p devtools.suite_cpu --suite-cpu=/tmp/suite-cpu
    python -m devtools.suite_cpu /tmp/suite-cpu --top 30

Processes still alive when a test ends (Inductor's compile workers) count for nobody.
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--suite-cpu", metavar="DIR", help="write per-test CPU times under DIR")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Generator[None, None, None]:
    directory = item.config.getoption("--suite-cpu")
    if not directory:
        yield
        return
    own0, children0 = _cpu()
    start = time.monotonic()
    yield
    own1, children1 = _cpu()
    wall = time.monotonic() - start
    Path(directory).mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(Path(directory) / f"{worker}.tsv", "a") as f:
        f.write(f"{item.nodeid}\t{wall:.2f}\t{own1 - own0:.2f}\t{children1 - children0:.2f}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("directory", help="the --suite-cpu directory of a run")
    parser.add_argument("--top", type=int, default=30, help="tests to list (default 30)")
    args = parser.parse_args()
    rows = []
    for path in sorted(Path(args.directory).glob("*.tsv")):
        for line in path.read_text().splitlines():
            test, wall, own, children = line.split("\t")
            rows.append(
                (float(own) + float(children), float(wall), float(own), float(children), test)
            )
    if not rows:
        raise SystemExit(f"no per-test records under {args.directory}")
    total = sum(r[0] for r in rows)
    own = sum(r[2] for r in rows)
    reaped = total - own
    print(f"{len(rows)} tests: {total:.0f} CPU-s ({own:.0f} in the workers, {reaped:.0f} reaped)")
    print(f"{'CPU s':>8} {'wall s':>8} {'own':>7} {'reaped':>7}  test")
    for cpu, wall, own_s, children, test in sorted(rows, reverse=True)[: args.top]:
        print(f"{cpu:8.1f} {wall:8.1f} {own_s:7.1f} {children:7.1f}  {test}")


if __name__ == "__main__":
    main()
