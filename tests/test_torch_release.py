"""The C++ backend builds against the torch releases it supports and loads only into the one
it was compiled against.

CMakeLists.txt refuses a torch outside its range at configure, and pyproject.toml declares
the same range. The build writes the release it compiled against
(torchneuron/_torch_release.py); the import compares it with the running torch's before
loading torchneuron._C, so a build for torch 2.13 in an environment upgraded to 2.14 says what
to do instead of failing with undefined symbols.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import run_python
from torchneuron._torch_release import BUILT_FOR

import torchneuron

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_the_build_is_for_the_running_release() -> None:
    assert BUILT_FOR == torch.__version__.split("+")[0]


@pytest.mark.parametrize("running", ["2.13.0", "2.13.0+cpu", "2.13.0+cu130"])
def test_a_local_build_tag_does_not_matter(running: str) -> None:
    torchneuron.check_torch_release(running, "2.13.0")  # no error


@pytest.mark.parametrize("running", ["2.14.1+cu130", "2.13.1", "2.12.0"])
def test_another_release_is_refused_with_what_to_do(running: str) -> None:
    with pytest.raises(ImportError) as error:
        torchneuron.check_torch_release(running, "2.13.0")
    message = str(error.value)
    assert f"built for torch 2.13.0 and cannot load into torch {running}" in message
    assert "pip install --no-build-isolation --no-deps ." in message


def _cmake_range() -> tuple[str, str]:
    text = (ROOT / "CMakeLists.txt").read_text()
    oldest = re.search(r"set\(TORCHNEURON_OLDEST_TORCH ([0-9.]+)\)", text)
    newest = re.search(r"set\(TORCHNEURON_NEWEST_TORCH ([0-9.]+)\)", text)
    assert oldest and newest, "CMakeLists.txt no longer sets the torch range it builds against"
    return oldest.group(1), newest.group(1)


def test_the_declared_range_is_the_range_the_build_accepts() -> None:
    oldest, newest = _cmake_range()
    major, minor = newest.split(".")
    declared = f"torch>={oldest},<{major}.{int(minor) + 1}"
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'dependencies = ["{declared}"]' in pyproject
    assert f'"{declared}"]' in pyproject.split("[project]")[0]  # the build requirements


def _fake_torch(root: pathlib.Path, version: str) -> pathlib.Path:
    """A package named torch that answers what cmake/torch_build_info.py asks of torch."""
    package = root / "torch"
    targets = package / "share" / "cmake" / "Caffe2"
    targets.mkdir(parents=True)
    (package / "__init__.py").write_text(
        f"__version__ = {version!r}\n\nclass _C:\n    _GLIBCXX_USE_CXX11_ABI = True\n"
    )
    (targets / "Caffe2Targets.cmake").write_text(
        'set_target_properties(torch_cpu PROPERTIES\n  INTERFACE_COMPILE_DEFINITIONS "USE_X"\n)\n'
    )
    return root


@pytest.mark.parametrize("version", ["2.12.1+cpu", "2.16.0+cu130"])
def test_the_build_refuses_a_torch_outside_the_range(version: str, tmp_path) -> None:
    cmake = shutil.which("cmake", path=os.path.dirname(sys.executable)) or shutil.which("cmake")
    assert cmake is not None, "cmake, a build requirement (requirements.txt), is not installed"
    oldest, newest = _cmake_range()
    environment = dict(os.environ, PYTHONPATH=str(_fake_torch(tmp_path / "site", version)))
    configure = subprocess.run(
        [
            cmake,
            "-S",
            str(ROOT),
            "-B",
            str(tmp_path / "build"),
            f"-DPython3_EXECUTABLE={sys.executable}",
        ],
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert configure.returncode != 0
    message = " ".join(configure.stdout.split() + configure.stderr.split())
    assert f"torchneuron builds against torch {oldest} to {newest}" in message
    assert f"is {version}. Install one of those" in message
    assert not (tmp_path / "build" / "_torch_release.py").exists()


def test_importing_torch_with_a_build_for_another_release_names_the_cause() -> None:
    # The torch.backends entry point imports torchneuron at `import torch`: a build for
    # another release stops there with the rebuild command, before the C++ extension loads.
    result = run_python(
        """
        import sys, types
        built_for = types.ModuleType("torchneuron._torch_release")
        built_for.BUILT_FOR = "2.12.0"
        sys.modules[built_for.__name__] = built_for
        try:
            import torch
        except RuntimeError as error:
            print("cause:", error.__cause__)
        print("C++ extension loaded:", "torchneuron._C" in sys.modules)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "cause: torchneuron was built for torch 2.12.0 and cannot load into torch" in (
        result.stdout
    )
    assert "C++ extension loaded: False" in result.stdout
