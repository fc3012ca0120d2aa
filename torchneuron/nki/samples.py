"""python -m torchneuron.nki.samples PATH: AWS's public NKI samples, run unchanged on a local
checkout of aws-neuron/nki-samples or of aws-neuron/aws-neuron-sdk, in both execution paths,
with a table of the outcomes.

What runs (nothing of the checkout is copied; only its imports are redirected, by
``install_aliases()``):

- its unit tests (``test/unit``) with its own ``--simulation-only`` switch: the numeric
  tests, each checking a reference or tutorial kernel against the test's numpy reference,
  with ``src/`` on the path as the tests' README asks;
- every tutorial kernel file with a ``__main__`` block (``src/**/*_nki_kernel*.py``), run
  with its default arguments; it passes when the block runs to its end, so it checks what
  the block checks (most compare with numpy; some only that the kernel runs);
- of an aws-neuron-sdk checkout, the NKI API examples (``nki/test``): the unittest files
  whose kernels the API reference quotes, each checked against numpy.

Each runs in its own process per execution path: ``interpret`` (the reference interpreter
for every call) and ``compiled`` (each kernel call is traced once on copies of its inputs,
then run by the compiled program, whose result the sample checks). A sample that needs
Trainium itself (torch_xla, a NEFF or a device profile) fails with the error that says so.

This module is also the pytest plugin the unit tests run under (``-p
torchneuron.nki.samples``), which sets the execution path from TORCHNEURON_NKI_SAMPLES_PATH.
"""

from __future__ import annotations

import argparse
import copy
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PATHS = ("interpret", "compiled")
_ENV = "TORCHNEURON_NKI_SAMPLES_PATH"


def use_execution_path(path: str) -> None:
    """Redirects NKI imports to torchneuron.nki and makes every kernel call take `path`."""
    from . import install_aliases
    from .launch import Kernel

    install_aliases()
    if path == "interpret":
        os.environ["TORCHNEURON_NKI_EXECUTION"] = "interpret"
        return
    if path != "compiled":
        raise ValueError(f"{_ENV}={path!r}: use 'interpret' or 'compiled'")
    os.environ["TORCHNEURON_NKI_EXECUTION"] = "compiled"
    run = Kernel.run

    def traced_then_compiled(
        self: Kernel, args: tuple[Any, ...], kwargs: dict[str, Any], compiled: bool
    ) -> Any:
        # The first call of a signature is the interpreter's (it records the program): trace
        # on copies, so the call the sample checks is the compiled program's.
        run(self, copy.deepcopy(args), copy.deepcopy(kwargs), True)
        return run(self, args, kwargs, True)

    Kernel.run = traced_then_compiled  # type: ignore[method-assign]
    Kernel.interpret = lambda self, *a, **k: self.run(a, k, True)  # type: ignore[method-assign]


def pytest_configure(config: Any) -> None:
    """Under pytest -p torchneuron.nki.samples: the path the command asked for."""
    use_execution_path(os.environ.get(_ENV, "interpret"))


@dataclass
class Outcome:
    name: str
    path: str
    status: str  # passed, failed, error, skipped
    message: str = ""


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("E ") or "Error" in line]
    return (errors[-1] if errors else lines[-1] if lines else "").removeprefix("E ").strip()[:160]


def _run_pytest(
    directory: Path, extra: list[str], path: str, select: str | None, pythonpath: list[Path]
) -> list[Outcome]:
    """The tests under `directory`, run by pytest in a process of their own with NKI imports
    redirected and every kernel call taking `path`; one outcome per test."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        command = [
            sys.executable, "-m", "pytest", str(directory), *extra, "-q",
            "-p", "torchneuron.nki.samples", "-p", "no:cacheprovider", f"--junitxml={report}",
        ]  # fmt: skip
        if select:
            command += ["-k", select]
        env = {
            **os.environ,
            _ENV: path,
            "PYTHONPATH": os.pathsep.join(
                [*map(str, pythonpath), os.environ.get("PYTHONPATH", "")]
            ),
        }
        done = subprocess.run(command, cwd=directory, env=env, capture_output=True, text=True)
        if not report.exists():
            return [Outcome(directory.name, path, "error", _first_line(done.stdout + done.stderr))]
        outcomes = []
        for case in ElementTree.parse(report).getroot().iter("testcase"):
            module = case.get("classname", "").split(".")[0]
            # a module that failed to import: pytest reports it under its own name
            name = f"{module}.py::{case.get('name')}" if module else f"{case.get('name')}.py"
            status, message = "passed", ""
            for tag in ("failure", "error", "skipped"):
                found = case.find(tag)
                if found is not None:
                    status = {"failure": "failed"}.get(tag, tag)
                    # junit's message attribute is the exception's own line
                    message = found.get("message", "").split("\n")[0][:200]
                    if not message or message == "collection failure":
                        message = _first_line(found.text or "") or message
            outcomes.append(Outcome(name, path, status, message))
        return outcomes


def run_unit_tests(root: Path, path: str, select: str | None) -> list[Outcome]:
    """aws-neuron/nki-samples' unit tests (``test/unit``), numeric tests only, with ``src/``
    on the path as their README asks."""
    unit = root / "test" / "unit"
    if not unit.is_dir():
        return []
    return _run_pytest(unit, ["--simulation-only"], path, select, [root / "src"])


def run_api_examples(root: Path, path: str, select: str | None) -> list[Outcome]:
    """aws-neuron/aws-neuron-sdk's NKI API examples (``nki/test``): unittest files whose
    kernels the API reference quotes, each checking its kernel against numpy."""
    return _run_pytest(root / "nki" / "test", ["--continue-on-collection-errors"], path, select, [])


def tutorial_files(root: Path) -> list[Path]:
    return sorted(
        f
        for f in (root / "src").rglob("*_nki_kernel*.py")
        if 'if __name__ == "__main__"' in f.read_text()
    )


def run_tutorial(root: Path, file: Path, path: str) -> Outcome:
    script = (
        "import runpy, sys; sys.path.insert(0, sys.argv[1]); "
        "from torchneuron.nki.samples import use_execution_path; use_execution_path(sys.argv[2]); "
        "sys.argv = [sys.argv[3]]; runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    command = [sys.executable, "-c", script, str(file.parent), path, str(file)]
    done = subprocess.run(command, cwd=file.parent, capture_output=True, text=True)
    name = str(file.relative_to(root))
    if done.returncode == 0:
        return Outcome(name, path, "passed")
    return Outcome(name, path, "failed", _first_line(done.stderr or done.stdout))


def commit_of(root: Path) -> str:
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True
        )
    except FileNotFoundError:
        return "unknown"
    return done.stdout.strip() or "unknown (not a git checkout)"


def table(outcomes: list[Outcome], paths: list[str]) -> str:
    by_name: dict[str, dict[str, Outcome]] = {}
    for o in outcomes:
        by_name.setdefault(o.name, {})[o.path] = o
    lines = [
        "| sample | " + " | ".join(paths) + " | first error |",
        "|---|" + "---|" * len(paths) + "---|",
    ]
    for name, per_path in by_name.items():
        statuses = [per_path[p].status if p in per_path else "-" for p in paths]
        message = next((o.message for o in per_path.values() if o.message), "")
        lines.append(f"| {name} | " + " | ".join(statuses) + f" | {message} |")
    for p in paths:
        chosen = [o for o in outcomes if o.path == p]
        passed = sum(o.status == "passed" for o in chosen)
        lines.append(f"\n{p}: {passed} of {len(chosen)} passed")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchneuron.nki.samples", description=__doc__)
    parser.add_argument(
        "path", type=Path, help="a checkout of aws-neuron/nki-samples or aws-neuron/aws-neuron-sdk"
    )
    parser.add_argument("--execution", choices=(*PATHS, "both"), default="both")
    parser.add_argument("-k", dest="select", help="only unit tests matching this expression")
    parser.add_argument("--no-tutorials", action="store_true")
    parser.add_argument("--no-unit-tests", action="store_true")
    a = parser.parse_args(argv)
    root = a.path.resolve()
    # aws-neuron-sdk has a src/ too (tools, no kernels); nki-samples has test/unit
    api_examples = (root / "nki" / "test").is_dir() and not (root / "test" / "unit").is_dir()
    if not (root / "src").is_dir() and not api_examples:
        print(
            f"error: {root} has neither src/ nor nki/test/: not a checkout of "
            "aws-neuron/nki-samples or aws-neuron/aws-neuron-sdk",
            file=sys.stderr,
        )
        return 2
    paths = list(PATHS) if a.execution == "both" else [a.execution]
    outcomes: list[Outcome] = []
    for path in paths:
        if api_examples:
            outcomes += run_api_examples(root, path, a.select)
            continue
        if not a.no_unit_tests:
            outcomes += run_unit_tests(root, path, a.select)
        if not a.no_tutorials:
            outcomes += [run_tutorial(root, f, path) for f in tutorial_files(root)]
    checkout = "aws-neuron/aws-neuron-sdk (nki/test)" if api_examples else "aws-neuron/nki-samples"
    print(f"{checkout} at {commit_of(root)}")
    print(table(outcomes, paths))
    return 0 if all(o.status in ("passed", "skipped") for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
