"""Device spec for the Hugging Face libraries' own test suites on ``neuron``.

Transformers and Diffusers run their model tests on a device named by a *device spec*: a
Python file given in ``TRANSFORMERS_TEST_DEVICE_SPEC`` / ``DIFFUSERS_TEST_DEVICE_SPEC``,
which ``transformers.testing_utils`` and ``diffusers.utils.testing_utils`` (and Diffusers'
``tests/testing_utils.py``) import and read attributes from. This module is that spec for
neuron. The libraries import the spec with ``importlib.import_module(path[:path.index(".py")])``,
so the variable must hold a bare file name in the directory pytest runs from (a path with
slashes is not a module name). ``python -m torchneuron.device.hf_test_device [DIR]`` therefore
writes a two-line file ``neuron_device_spec.py`` into DIR that re-exports this module, and prints
the environment to use (stdout is shell, so
``eval "$(python -m torchneuron.device.hf_test_device)"`` works). docs/hf_test_suites.md has the
commands and measured results.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from torchneuron import device as _neuron

# Every attribute either library reads from a spec (transformers 5.24: DEVICE_NAME,
# MANUAL_SEED_FN, EMPTY_CACHE_FN, DEVICE_COUNT_FN, SINGLE_PROCESS_DEVICE; diffusers 0.42:
# the same seed/cache/count functions, SUPPORTS_TRAINING and the three memory functions).
DEVICE_NAME: str = "neuron"
MANUAL_SEED_FN: Callable[[int], None] = _neuron.manual_seed
EMPTY_CACHE_FN: Callable[[], None] = _neuron.empty_cache
DEVICE_COUNT_FN: Callable[[], int] = _neuron.device_count
RESET_PEAK_MEMORY_STATS_FN: Callable[..., None] = _neuron.reset_peak_memory_stats
RESET_MAX_MEMORY_ALLOCATED_FN: Callable[..., None] = _neuron.reset_max_memory_allocated
MAX_MEMORY_ALLOCATED_FN: Callable[..., int] = _neuron.max_memory_allocated
# Autograd, optimizers and training loops run on neuron (the CPU's kernels, forward and backward).
SUPPORTS_TRAINING: bool = True
# Transformers runs `@run_test_using_subprocess` tests in-process on single-process devices.
# The software runtime lets several processes open the same cores, so subprocesses work.
SINGLE_PROCESS_DEVICE: bool = False

SPEC_ATTRIBUTES: tuple[str, ...] = (
    "DEVICE_NAME",
    "MANUAL_SEED_FN",
    "EMPTY_CACHE_FN",
    "DEVICE_COUNT_FN",
    "RESET_PEAK_MEMORY_STATS_FN",
    "RESET_MAX_MEMORY_ALLOCATED_FN",
    "MAX_MEMORY_ALLOCATED_FN",
    "SUPPORTS_TRAINING",
    "SINGLE_PROCESS_DEVICE",
)

SHIM_FILE_NAME: str = "neuron_device_spec.py"
_SHIM_MARKER = "# Written by `python -m torchneuron.device.hf_test_device`"


def shim_source() -> str:
    """The text of ``neuron_device_spec.py``: a re-export of this module's spec attributes."""
    names = "".join(f"    {name},\n" for name in SPEC_ATTRIBUTES)
    return (
        f"{_SHIM_MARKER}: the neuron device spec for the Hugging Face\n"
        "# test suites (TRANSFORMERS_TEST_DEVICE_SPEC / DIFFUSERS_TEST_DEVICE_SPEC).\n"
        f"from torchneuron.device.hf_test_device import (  # noqa: F401\n{names})\n"
    )


def write_shim(directory: str | Path = ".", overwrite: bool = False) -> Path:
    """Writes ``neuron_device_spec.py`` into ``directory`` and returns its path.

    Rewriting a file this command wrote is always allowed; any other file of that name is
    kept unless ``overwrite`` is true.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise NotADirectoryError(
            f"{directory} is not a directory: pass the directory pytest will run from "
            "(the test suite's repository root)"
        )
    path = directory / SHIM_FILE_NAME
    if path.exists() and not overwrite:
        existing = path.read_text(errors="replace")
        if not existing.startswith(_SHIM_MARKER):
            raise FileExistsError(
                f"{path} exists and was not written by torchneuron.device.hf_test_device; "
                "remove it or pass --overwrite"
            )
    path.write_text(shim_source())
    return path


def environment_lines(spec_file_name: str = SHIM_FILE_NAME) -> list[str]:
    """Shell lines selecting neuron (and its spec) for both libraries' test suites."""
    return [
        f"export TRANSFORMERS_TEST_DEVICE={DEVICE_NAME}",
        f"export TRANSFORMERS_TEST_DEVICE_SPEC={spec_file_name}",
        f"export DIFFUSERS_TEST_DEVICE={DEVICE_NAME}",
        f"export DIFFUSERS_TEST_DEVICE_SPEC={spec_file_name}",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m torchneuron.device.hf_test_device",
        description=(
            f"Write {SHIM_FILE_NAME} (the neuron device spec for the Transformers and Diffusers "
            "test suites) into DIR and print the environment that selects it. Run pytest "
            "from DIR as `python -m pytest` (Diffusers imports the spec from the current "
            "directory)."
        ),
    )
    parser.add_argument(
        "directory",
        nargs="?",
        default=".",
        metavar="DIR",
        help="directory pytest runs from (default: the current directory)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help=f"replace an existing {SHIM_FILE_NAME} this command did not write",
    )
    args = parser.parse_args(argv)
    try:
        path = write_shim(args.directory, overwrite=args.overwrite)
    except (NotADirectoryError, FileExistsError) as error:
        parser.exit(2, f"error: {error}\n")
    # stdout is shell (eval-able); the commentary names the directory to run pytest from.
    print(f"# wrote {path.resolve()}; run `python -m pytest` from {path.parent.resolve()}")
    print("\n".join(environment_lines()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
