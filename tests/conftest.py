"""Shared helpers for the torchneuron test suite.

The in-process tests run with the default topology (trn2, LNC=2: four neuron devices) and the
default host-memory budget; tests that need another configuration run Python in a subprocess
with their own environment (``run_python``).
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

# The topology and budget are read when the runtime initialises (lazily, on first use), so
# clearing them here, before any test touches the device, pins the in-process configuration.
_CONFIG_VARIABLES = (
    "NEURON_PLATFORM_TARGET_OVERRIDE",
    "NEURON_LOGICAL_NC_CONFIG",
    "NEURON_RT_VISIBLE_CORES",
    "TORCHNEURON_HOST_MEMORY_BUDGET",
    "TORCHNEURON_CHIPS",
    "TORCH_DEVICE_BACKEND_AUTOLOAD",
    # AWS's simulator switches, read at each NKI call: the suite chooses the path per test.
    "NKI_SIMULATOR",
    "NKI_PRECISE_FP",
    "TORCHNEURON_NKI_EXECUTION",
)
for _name in _CONFIG_VARIABLES:
    os.environ.pop(_name, None)
# A custom op whose outputs alias its inputs or each other is an error, as in PyTorch's own CI
# (torch makes it one when CI is set, a warning otherwise): the suite holds every host to it.
os.environ["TORCHINDUCTOR_ERROR_ON_CUSTOM_OP_ALIASING"] = "1"
# The launch mode (NEURON_LAUNCH_BLOCKING, TORCHNEURON_ASYNC_MIN_BYTES) is kept, and passed
# on to subprocesses: the suite runs in either mode (scripts/test.sh runs both).

# Compiled graphs go to a cache of this run's own, so no test depends on (or is helped by)
# what an earlier run left in the system temp directory. Under pytest-xdist each worker has its
# own (tests count what they compile). Ranks spawned by the tests import this module too: they
# reuse their parent's directory.
_NEFF_OWNER = os.environ.get("PYTEST_XDIST_WORKER", "main")
_KERNELS = "TORCHNEURON_TEST_INDUCTOR_CACHE_DIR"
if os.environ.get("TORCHNEURON_TEST_NEFF_OWNER") != _NEFF_OWNER:
    os.environ["TORCHNEURON_TEST_NEFF_OWNER"] = _NEFF_OWNER
    os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"] = tempfile.mkdtemp(prefix="torchneuron-test-neff-")
    atexit.register(shutil.rmtree, os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"], ignore_errors=True)
    # Inductor's C++ kernel libraries, by contrast, are shared by every worker of the run
    # (scripts/test.sh passes one directory to all its pytest passes): they are named by a
    # hash of their source and flags, so sharing saves g++ runs and changes no result, and no
    # test counts them (the neuron cache's counters are per worker). Tests of where the
    # kernels go give their subprocesses a directory of their own.
    if not os.environ.get(_KERNELS):
        os.environ[_KERNELS] = tempfile.mkdtemp(prefix="torchneuron-test-inductor-")
        atexit.register(shutil.rmtree, os.environ[_KERNELS], ignore_errors=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.environ[_KERNELS]

import pytest  # noqa: E402
import torch  # noqa: E402

SUBPROCESS_TIMEOUT = 120


def clean_env(**overrides: str) -> dict[str, str]:
    """The current environment without neuron configuration, plus `overrides`."""
    env = {k: v for k, v in os.environ.items() if k not in _CONFIG_VARIABLES}
    env.update(overrides)
    return env


def run_python(
    code: str, env: dict[str, str] | None = None, cwd: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Runs `code` with this interpreter in a fresh process (clean neuron configuration)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=clean_env(**(env or {})),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
    )


class Pending:
    """A Python subprocess started by `start_python`; `result()` waits for it."""

    def __init__(self, code: str, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)],
            env=clean_env(**(env or {})),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._result: subprocess.CompletedProcess[str] | None = None

    def result(self) -> subprocess.CompletedProcess[str]:
        if self._result is None:
            try:
                out, err = self.process.communicate(timeout=SUBPROCESS_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                out, err = self.process.communicate()
                err += f"\n[killed after {SUBPROCESS_TIMEOUT} s]"
            self._result = subprocess.CompletedProcess(
                self.process.args, self.process.returncode, out, err
            )
        return self._result


def start_python(code: str, env: dict[str, str] | None = None) -> Pending:
    """Starts `code` in a fresh interpreter now (so several can run at once)."""
    return Pending(code, env)


def start_all(scripts: dict[str, tuple[str, dict[str, str]]]) -> dict[str, Pending]:
    """Starts every (code, env) of `scripts` concurrently, keyed like `scripts`."""
    return {key: start_python(code, env) for key, (code, env) in scripts.items()}


def describe(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"


# A folder of this repository put on sys.path by a test changes what every later test in that
# worker imports (benchmarks/ holds nki.py, which shadows the `nki` alias the NKI tests
# install): beyond what the suite starts with, only pytest's own entry for tests/ may join.
# (Libraries append folders of their own, such as setuptools' vendored packages: not checked.)
_SYS_PATH_AT_START = list(sys.path)
_ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
_TESTS_DIR = os.path.join(_ROOT, "tests")
_ENVIRONMENT = os.path.realpath(sys.prefix)  # .venv, inside the repository


def _repository_folders_added(before: list[str]) -> list[str]:
    def ours(path: str) -> bool:
        inside = (path + os.sep).startswith
        return path != _TESTS_DIR and inside(_ROOT + os.sep) and not inside(_ENVIRONMENT + os.sep)

    return [p for p in (os.path.realpath(p or ".") for p in sys.path if p not in before) if ours(p)]


def pytest_collection_finish(session: pytest.Session) -> None:
    if added := _repository_folders_added(_SYS_PATH_AT_START):
        raise pytest.UsageError(
            f"importing the test modules added {added} to sys.path; load the module from its "
            "file (importlib.util.spec_from_file_location) or import it from a package"
        )


@pytest.fixture(autouse=True)
def _sys_path_unchanged():  # noqa: ANN202 - a fixture
    """A test leaves no folder of the repository on sys.path (monkeypatch restores first)."""
    before = list(sys.path)
    yield
    added = _repository_folders_added(before)
    assert not added, f"the test put {added} on sys.path"


@pytest.fixture(autouse=True)
def _restore_current_device_and_stream():
    """Every test starts and ends on neuron:0 with its default stream current."""
    torch.neuron.set_device(0)
    yield
    torch.neuron.set_device(0)
    torch.neuron.set_stream(torch.neuron.default_stream(0))


def tiny_llama_config(**overrides: object):  # noqa: ANN201 - transformers type
    """A two-layer Llama config small enough to build and run in milliseconds."""
    from transformers import LlamaConfig

    sizes: dict[str, object] = {
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    sizes.update(overrides)
    return LlamaConfig(**sizes)


def tiny_llama(**overrides: object):  # noqa: ANN201 - transformers type
    """A tiny Llama with random weights from seed 0 (the same weights on every call)."""
    from transformers import LlamaForCausalLM

    config = tiny_llama_config(**overrides)
    torch.manual_seed(0)
    return LlamaForCausalLM(config)
