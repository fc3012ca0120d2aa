"""The C++ backend loads only into the torch release it was compiled against.

The build writes that release (torchneuron/_torch_release.py, from CMakeLists.txt); the
import compares it with the running torch's before loading torchneuron._C, so a build for
torch 2.13 in an environment upgraded to 2.14 says what to do instead of failing with
undefined symbols.
"""

from __future__ import annotations

import pytest
import torch
from torchneuron._torch_release import BUILT_FOR

import torchneuron


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
