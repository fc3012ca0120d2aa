"""The documentation against the code, so neither drifts from the other.

- README.md's environment-variable table lists exactly the project's variables the code reads.
- Every ``python -m <module>`` command README.md, examples/README.md and docs/*.md show runs
  ``<module> --help`` with exit 0, and has every ``--flag`` the command names.
- The examples of examples/README.md run, with their shortest settings, and do what they print.

The subprocesses (one interpreter for all the ``--help`` runs, one per example command) all
start together the first time a test needs one, and each test waits for its own, so the file
takes its CPU time (about 2.5 CPU-minutes, most of it the compiled Diffusers run and the four
SFT ranks) over the cores it gets, rather than the sum of the runs' times.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import clean_env

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
COMMAND_DOCS = [README, ROOT / "examples" / "README.md", *DOCS]

# -- 1. environment variables ----------------------------------------------------------------

# The project's own knobs: its names and TorchNeuron's (NEURON_*, TORCH_NEURONX_*, and NKI's
# NKI_*). Variables of other tools the code reads (torchrun's RANK / LOCAL_RANK / WORLD_SIZE,
# XDG_*, CXX, TORCHINDUCTOR_CACHE_DIR) are theirs to document.
PROJECT_PREFIXES = ("NEURON_", "TORCHNEURON_", "TORCH_NEURONX_", "NKI_")
CODE_DIRS = ("torchneuron", "compat", "csrc", "demo", "devtools")

# Read by the package, but plumbing between the project's own processes, not a setting.
INTERNAL = {
    # tests/test_fuzz.py sets it so the fuzz harness's child runs the self-test targets (a
    # target that crashes, hangs or finds something on purpose) instead of the real ones.
    "TORCHNEURON_FUZZ_SELFTEST",
    # python -m torchneuron.nki.samples sets it for the pytest run it starts, whose plugin
    # (the same module) reads it to choose the execution path.
    "TORCHNEURON_NKI_SAMPLES_PATH",
}
# In the table although the project's code does not read it: PyTorch reads it before loading
# the `torch.backends` entry point that imports torchneuron (checked in the test below).
READ_BY_TORCH = {"TORCH_DEVICE_BACKEND_AUTOLOAD"}
# tests/ and benchmarks/ are not part of the scan above: they set the package's variables to
# choose a configuration, and read only those, plus these of the suite's own (conftest.py:
# ranks and subprocesses started by a test reuse their parent's compile cache; every pass of
# scripts/test.sh shares one directory of Inductor's kernels). The test checks that this
# stays so.
SUITE_PLUMBING = {"TORCHNEURON_TEST_NEFF_OWNER", "TORCHNEURON_TEST_INDUCTOR_CACHE_DIR"}

_C_READ = re.compile(r"\b(?:std::)?(?:secure_)?getenv\s*\(([^()]*)\)|\bget_env\s*\(([^()]*)\)")
_C_LITERAL = re.compile(r'\s*"([A-Za-z0-9_]+)"\s*')
# csrc/runtime/env.{h,cpp} define nrt::get_env, the wrapper of std::getenv the runtime uses.
_C_HELPER = {Path("csrc/runtime/env.h"), Path("csrc/runtime/env.cpp")}


@dataclass
class Reads:
    names: dict[str, set[str]]  # variable -> files reading it
    unresolved: list[str]  # reads whose variable name is not a literal or constant


def _is_environ(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "environ"
        and isinstance(node.value, ast.Name)
        and node.value.id == "os"
    )


def _python_reads(files: Iterator[Path], reads: Reads) -> None:
    for path in files:
        _python_file_reads(path, reads)


def _python_file_reads(path: Path, reads: Reads) -> None:
    """os.environ.get(X), os.environ[X], os.getenv(X), X in os.environ: X a string literal
    or a module-level string constant."""
    tree = ast.parse(path.read_text(), str(path))
    relative = str(path.relative_to(ROOT))
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }

    def record(key: ast.AST, where: ast.expr) -> None:
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            name = key.value
        elif isinstance(key, ast.Name) and key.id in constants:
            name = constants[key.id]
        else:
            reads.unresolved.append(f"{relative}:{where.lineno}")
            return
        reads.names.setdefault(name, set()).add(relative)

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            func = node.func
            environ_get = func.attr == "get" and _is_environ(func.value)
            getenv = (
                func.attr == "getenv" and isinstance(func.value, ast.Name) and func.value.id == "os"
            )
            if environ_get or getenv:
                record(node.args[0], node)
        elif (
            isinstance(node, ast.Subscript)
            and _is_environ(node.value)
            and isinstance(node.ctx, ast.Load)
        ):
            record(node.slice, node)
        elif isinstance(node, ast.Compare) and any(
            isinstance(op, ast.In | ast.NotIn) for op in node.ops
        ):
            if any(_is_environ(c) for c in node.comparators):
                record(node.left, node)


def _cxx_reads(files: Iterator[Path], reads: Reads) -> None:
    """std::getenv("X"), getenv("X"), secure_getenv("X") and nrt::get_env("X")."""
    for path in files:
        relative = path.relative_to(ROOT)
        if relative in _C_HELPER:
            continue
        text = re.sub(r"/\*.*?\*/", "", path.read_text(), flags=re.S)
        text = re.sub(r"//[^\n]*", "", text)
        for match in _C_READ.finditer(text):
            argument = match.group(1) if match.group(1) is not None else match.group(2)
            literal = _C_LITERAL.fullmatch(argument)
            if literal is None:
                line = text.count("\n", 0, match.start()) + 1
                reads.unresolved.append(f"{relative}:{line}")
            else:
                reads.names.setdefault(literal.group(1), set()).add(str(relative))


def environment_reads(dirs: tuple[str, ...]) -> Reads:
    """Every environment variable the Python and C++ code under `dirs` reads."""
    reads = Reads({}, [])
    for name in dirs:
        base = ROOT / name
        _python_reads(base.rglob("*.py"), reads)
        cxx = (p for p in base.rglob("*") if p.suffix in (".cpp", ".cc", ".h", ".hpp"))
        _cxx_reads(cxx, reads)
    return reads


def project_variables(reads: Reads) -> set[str]:
    return {name for name in reads.names if name.startswith(PROJECT_PREFIXES)}


def readme_table() -> dict[str, tuple[str, str]]:
    """README.md's environment-variable table: variable -> (meaning, default)."""
    rows: dict[str, tuple[str, str]] = {}
    lines = README.read_text().splitlines()
    start = lines.index("| variable | meaning | default |")
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        match = re.fullmatch(r"`([A-Z][A-Z0-9_]*)`", cells[0])
        assert match and len(cells) == 3 and all(cells), f"malformed row: {line}"
        assert match.group(1) not in rows, f"listed twice: {match.group(1)}"
        rows[match.group(1)] = (cells[1], cells[2])
    return rows


def test_scanner_finds_each_kind_of_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan itself, on a small tree: each form of read counts, writes do not, and a read
    whose name it cannot tell is reported rather than missed."""
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text(
        textwrap.dedent(
            """
            import os
            NAME = "TORCHNEURON_CONST"
            os.environ.get("TORCHNEURON_GET", "1")
            os.environ["TORCHNEURON_ITEM"]
            os.getenv("NEURON_GETENV")
            "TORCH_NEURONX_IN" in os.environ
            os.environ.get(NAME)
            os.environ["TORCHNEURON_WRITTEN"] = "1"
            os.environ.setdefault("TORCHNEURON_DEFAULTED", "1")
            os.environ.get(f"TORCHNEURON_{NAME}")
            os.environ.get("RANK")
            """
        )
    )
    (tmp_path / "pkg" / "b.cpp").write_text(
        textwrap.dedent(
            """
            auto a = std::getenv("TORCHNEURON_C");
            auto b = nrt::get_env("NEURON_C_HELPER").value_or("");
            // std::getenv("TORCHNEURON_COMMENTED")
            auto c = get_env(name);
            """
        )
    )
    reads = environment_reads(("pkg",))
    assert project_variables(reads) == {
        "TORCHNEURON_CONST", "TORCHNEURON_GET", "TORCHNEURON_ITEM", "NEURON_GETENV",
        "TORCH_NEURONX_IN", "TORCHNEURON_C", "NEURON_C_HELPER",
    }  # fmt: skip
    assert "RANK" in reads.names
    assert reads.unresolved == ["pkg/a.py:11", "pkg/b.cpp:5"]


def test_readme_environment_table_lists_what_the_code_reads() -> None:
    reads = environment_reads(CODE_DIRS)
    assert reads.unresolved == [], "reads of a variable whose name the scan cannot tell"
    read = project_variables(reads)
    table = set(readme_table())
    missing = read - INTERNAL - table
    assert not missing, {name: sorted(reads.names[name]) for name in sorted(missing)}
    assert table - read - READ_BY_TORCH == set(), "listed in README.md, read by no code"
    assert INTERNAL <= read and not INTERNAL & table  # the allow-list is neither stale nor moot

    # The variables listed for PyTorch's sake: PyTorch reads them, and loads the project by
    # the entry point they govern.
    torch_init = Path(torch.__file__).read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    for name in READ_BY_TORCH:
        assert name in table and name not in read
        assert f'"{name}"' in torch_init
    assert '[project.entry-points."torch.backends"]' in pyproject

    # tests/ and benchmarks/ read no variable of the project's that is not the package's.
    others = project_variables(environment_reads(("tests", "benchmarks"))) - read
    assert others == SUITE_PLUMBING, others


# -- 2. python -m commands in the docs -------------------------------------------------------

# Packages whose commands must accept --help and the flags the docs give them; other modules
# the docs run (pytest) are another project's: only importable.
OWN_PACKAGES = ("torchneuron", "benchmarks", "demo", "devtools")
_COMMAND = re.compile(r"python3? -m (\S+)([^`\n]*)")


def _snippets(text: str) -> Iterator[str]:
    """The code in fenced blocks (continued lines joined, comments cut) and in code spans."""
    outside: list[str] = []
    for i, part in enumerate(re.split(r"^```[^\n]*\n", text, flags=re.M)):
        if i % 2 == 0:
            outside.append(part)
            continue
        for line in part.replace("\\\n", " ").splitlines():
            yield re.sub(r"(^|\s)#.*", "", line)
    for span in re.findall(r"`([^`]+)`", "\n".join(outside)):
        yield span.replace("\n", " ")


def documented_commands() -> dict[str, set[str]]:
    """Module -> the --flags the docs pass to it, over every `python -m` command shown."""
    commands: dict[str, set[str]] = {}
    for path in COMMAND_DOCS:
        for snippet in _snippets(path.read_text()):
            for match in _COMMAND.finditer(snippet):
                module = match.group(1).rstrip(")\"'`;,")
                if "<" in module:  # a placeholder (`python -m devtools.<name>`)
                    continue
                rest = re.split(r"\)|&&|\|\||;|\|", match.group(2))[0]
                flags = {m for m in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", rest)}
                commands.setdefault(module, set()).update(flags)
    return commands


def test_documented_commands_are_found() -> None:
    """The extraction, on the commands the docs are known to show."""
    commands = documented_commands()
    expected = {"torchneuron.fidelity.fit", "devtools.fuzz", "torchneuron.device.hf_test_device"}
    assert expected <= set(commands)
    assert {"--seq", "--batch", "--grad-checkpointing", "--fsdp", "--html"} <= commands[
        "torchneuron.fidelity.fit"
    ]
    assert "--examples" in commands["devtools.fuzz"]
    assert not any("<" in module or module.endswith(".") for module in commands)


# Runs `<module> --help` for each module in one interpreter (torch is imported once), writing
# {module: {"exit": code or error, "output": text}} as JSON.
HELP_DRIVER = """
import contextlib, io, json, runpy, sys
modules, report = json.loads(sys.argv[1]), sys.argv[2]
results = {}
for module in modules:
    out = io.StringIO()
    sys.argv = [module, "--help"]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        status = "returned without exiting: --help ran the command"
    except SystemExit as e:
        status = 0 if e.code is None else e.code
    except BaseException as e:
        status = f"{type(e).__name__}: {e}"
    results[module] = {"exit": status, "output": out.getvalue()}
with open(report, "w") as f:
    json.dump(results, f)
"""


def test_documented_python_m_commands_take_help_and_their_flags(
    runs: dict[str, Run],
) -> None:
    commands = documented_commands()
    own = {m: f for m, f in commands.items() if m.split(".")[0] in OWN_PACKAGES}
    foreign = sorted(set(commands) - set(own))
    missing = [m for m in foreign if importlib.util.find_spec(m.split(".")[0]) is None]
    assert not missing, f"the docs run modules that are not installed: {missing}"

    runs["help"].wait()
    results = json.loads((runs["help"].directory / "help.json").read_text())
    assert set(results) == set(own)
    problems = []
    for module, flags in sorted(own.items()):
        exit_status, output = results[module]["exit"], results[module]["output"]
        if exit_status != 0 or "usage:" not in output:
            problems.append(f"{module} --help: exit {exit_status}\n{output[-2000:]}")
            continue
        unknown = [f for f in sorted(flags) if not re.search(rf"(?<![\w-]){f}(?![\w-])", output)]
        if unknown:
            problems.append(f"{module}: the docs pass {unknown}, which --help does not list")
    assert not problems, "\n\n".join(problems)


# -- 3. the examples -------------------------------------------------------------------------

TIMEOUT_S = 900  # generous: the suite may share two cores with other work
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]


@dataclass
class Run:
    """A command started in its own session, with its output and TMPDIR in `directory`."""

    process: subprocess.Popen[bytes]
    directory: Path
    returncode: int | None = None

    def wait(self) -> str:
        """Waits for the command; fails the test with its output unless it exited 0.
        Returns stdout."""
        if self.returncode is None:
            try:
                self.returncode = self.process.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)  # torchrun's ranks too
                self.returncode = self.process.wait()
        out = (self.directory / "stdout").read_text(errors="replace")
        err = (self.directory / "stderr").read_text(errors="replace")
        assert self.returncode == 0, (
            f"{self.process.args}: exit {self.returncode}\n--- stdout\n{out[-4000:]}\n"
            f"--- stderr\n{err[-6000:]}"
        )
        return out


def _start(argv: list[str], directory: Path) -> Run:
    env = clean_env(TMPDIR=str(directory), TOKENIZERS_PARALLELISM="false")
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    with open(directory / "stdout", "wb") as out, open(directory / "stderr", "wb") as err:
        process = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=out, stderr=err, start_new_session=True
        )
    return Run(process, directory)


# The run each test checks, so that the fixture below starts only those of the selected tests.
RUN_OF_TEST = {
    "test_documented_python_m_commands_take_help_and_their_flags": "help",
    "test_example_lora": "lora",
    "test_example_sft_distributed": "sft_distributed",
    "test_example_diffusers_pipeline": "diffusers",
    "test_example_diffusers_pipeline_tensor_parallel": "diffusers_tp",
}


@pytest.fixture(scope="module")
def runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Run]]:
    """Starts the --help driver and the example runs of the selected tests, all at once."""
    selected = {
        RUN_OF_TEST[item.name]
        for item in request.session.items
        if item.name in RUN_OF_TEST and item.path == request.path
    }
    own = sorted(m for m in documented_commands() if m.split(".")[0] in OWN_PACKAGES)
    d = {name: tmp_path_factory.mktemp(name) for name in RUN_OF_TEST.values()}
    commands = {
        "help": [sys.executable, "-c", HELP_DRIVER, json.dumps(own), str(d["help"] / "help.json")],
        "lora": [sys.executable, "examples/lora.py", "--base-steps", "2", "--lora-steps", "2"],
        "sft_distributed": [
            *TORCHRUN, "--nproc-per-node", "4", "examples/sft_distributed.py", "--steps", "2",
        ],
        "diffusers": [
            sys.executable, "examples/diffusers_pipeline.py", "--out", str(d["diffusers"]),
        ],
        "diffusers_tp": [
            *TORCHRUN, "--nproc-per-node", "2", "examples/diffusers_pipeline.py", "--tp",
            "--out", str(d["diffusers_tp"]),
        ],
    }  # fmt: skip
    started = {name: _start(argv, d[name]) for name, argv in commands.items() if name in selected}
    yield started
    for run in started.values():
        if run.process.poll() is None:  # a test failed before waiting for it
            os.killpg(run.process.pid, signal.SIGKILL)
            run.process.wait()


def _match(pattern: str, text: str) -> re.Match[str]:
    match = re.search(pattern, text)
    assert match, f"no {pattern!r} in:\n{text}"
    return match


def _number(pattern: str, text: str) -> float:
    return float(_match(pattern, text).group(1))


def test_example_lora(runs: dict[str, Run]) -> None:
    """examples/lora.py: base frozen, adapters trained, saved, reloaded and merged into a
    plain model that gives the trained model's logits and answers."""
    from safetensors.torch import load_file

    out = runs["lora"].wait()
    assert out.rstrip().endswith("OK"), out
    trainable, total = _match(r"trainable parameters: (\d+) of (\d+)", out).groups()
    assert 0 < int(trainable) < int(total) / 10  # rank-8 adapters only: the base is frozen
    losses = re.findall(r"loss (\S+) -> (\S+)", out)
    assert len(losses) == 2 and all(math.isfinite(float(x)) for pair in losses for x in pair)

    adapter = Path(_match(r"saved the adapters to (\S+) ", out).group(1))
    assert adapter.is_relative_to(runs["lora"].directory)
    weights = load_file(adapter / "adapter_model.safetensors")
    lora_b = [w for name, w in weights.items() if "lora_B" in name]
    # q/k/v/o of each layer; B starts at zero, so nonzero B means the adapters were trained
    assert len(lora_b) == len(weights) // 2 > 0 and all(w.abs().max() > 0 for w in lora_b)
    assert "a plain LlamaForCausalLM" in out
    assert _number(r"merged\| = (\S+) ", out) < 1e-3
    assert _match(r"identical on (\d+)/\1 held-out", out)


def test_example_sft_distributed(runs: dict[str, Run]) -> None:
    """examples/sft_distributed.py under torchrun (4 ranks): a 2 x 2 (FSDP x TP) mesh, each
    rank holding a quarter of each matrix, trained by SFTTrainer, saved unsharded."""
    from safetensors.torch import load_file

    out = runs["sft_distributed"].wait()
    assert "DeviceMesh((fsdp=2, tp=2), 'neuron'" in out, out
    shapes = _match(r"global \((\d+), (\d+)\),.* local shard \((\d+), (\d+)\) on neuron:0", out)
    rows, cols, local_rows, local_cols = map(int, shapes.groups())
    assert (local_rows, local_cols) == (rows // 4, cols)
    first, last = _match(r"loss (\S+) -> (\S+) over 2 steps", out).groups()
    assert math.isfinite(float(first)) and math.isfinite(float(last))

    directory = runs["sft_distributed"].directory
    checkpoint = directory / "sft-distributed-checkpoint"
    assert f"saved an unsharded checkpoint to {checkpoint}" in out, out
    (initial_dir,) = directory.glob("sft-distributed-0-*")  # rank 0's untrained model
    initial = load_file(initial_dir / "model.safetensors")
    saved = load_file(checkpoint / "model.safetensors")
    assert {k: v.shape for k, v in saved.items()} == {k: v.shape for k, v in initial.items()}
    q_proj = saved["model.layers.0.self_attn.q_proj.weight"]
    assert tuple(q_proj.shape) == (rows, cols)  # whole, not a shard
    assert any(not torch.equal(saved[k], initial[k]) for k in saved)  # trained


def _image(path: Path) -> torch.Tensor:
    import numpy as np
    from PIL import Image

    with Image.open(path) as image:
        assert image.size == (128, 128) and image.mode == "RGB"
        return torch.from_numpy(np.array(image, dtype=np.int16))


def _check_pngs(directory: Path, other: str) -> None:
    eager, image = _image(directory / "flux_eager.png"), _image(directory / other)
    assert eager.float().std() > 0  # an image, not a constant
    # within 1e-5 of eager (below): 8-bit pixels differ by at most one level of rounding
    assert (eager - image).abs().max() <= 1


def test_example_diffusers_pipeline(runs: dict[str, Run]) -> None:
    """examples/diffusers_pipeline.py: eager, then the transformer compiled (one graph),
    within docs/diffusers.md's 1e-5 of eager; both PNGs written."""
    out = runs["diffusers"].wait()
    assert _number(r"graphs compiled: (\d+)", out) == 1
    assert _number(r"compiled: max \|difference\| vs eager = (\S+)", out) <= 1e-5
    _check_pngs(runs["diffusers"].directory, "flux_compiled.png")


def test_example_diffusers_pipeline_tensor_parallel(runs: dict[str, Run]) -> None:
    """The same under torchrun with --tp: the transformer split over 2 ranks' devices, within
    1e-5 of one device's image."""
    out = runs["diffusers_tp"].wait()
    assert _number(r"tensor-parallel x2: max \|difference\| vs eager = (\S+)", out) <= 1e-5
    _check_pngs(runs["diffusers_tp"].directory, "flux_tp.png")
