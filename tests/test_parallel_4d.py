"""examples/parallel_4d.py as torchrun runs it: 4-D parallel training equals one device.

The cp x tp subset runs under torchrun itself; the other runs fork their ranks from a process
that has imported torch (tests/support/ranks.py::run_script: the same script, as __main__, with
the variables torchrun sets), which spares each rank 3 CPU-s of imports.

Layouts (pp x dp_shard x cp x tp), each run's printed losses against the single-device run
(``--reference``) of the same model, batches and optimizer:

- 2 x 2 x 2 x 2 on 16 ranks (every dimension at once; ``TORCHNEURON_CHIPS=4`` gives each
  process 16 devices, LOCAL_RANK picks its own), Schedule1F1B;
- 1 x 1 x 2 x 2 (cp x tp) and 2 x 1 x 2 x 1 (pp x cp, ScheduleGPipe) on 4 ranks;
- resharding: 1 x 2 x 1 x 2 (dp x tp) trains steps 0-2 and saves a DCP checkpoint, which
  2 x 2 x 1 x 1 (pp x dp) loads and trains steps 3-5: those losses equal the uninterrupted
  single-device run's (so the momentum buffers came back too);
- the same checkpoint in a CPU-only process (TORCH_DEVICE_BACKEND_AUTOLOAD=0, torchneuron never
  imported): ``dcp_to_torch_save`` into a plain model gives the single-device weights after
  step 3 and its loss of step 3.

Tolerance: float32 throughout; the layouts change the order of reductions (sums split over tp,
gradients averaged over dp and cp, ring attention merging blocks through their logsumexp,
microbatch gradients accumulated), so losses match within rounding, not bitwise. Measured max
differences from the reference over 6 steps of SGD (lr 0.5, momentum 0.9): 4.7e-7 (16 ranks),
4.8e-7 (cp x tp, pp x cp, dp x tp, and pp x dp resumed), i.e. one float32 ulp at 4.9; weights
after 3 steps 1.2e-7 (largest weight 4.1), momentum 7.5e-9. LOSS_ATOL is 20x that, while a
mis-scaled gradient (the pipeline not dividing by its 2 microbatches) moves the losses by 0.03
at step 1 and 0.4 at step 5.

Wall time on 2 cores (quiet): 31 s for the file: 10 s the 16-rank run, 8 s the checkpoint
test, 9 s the cp x tp subset under torchrun, 1 s the pp x cp one, 3 s the reference.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import clean_env
from support.ranks import run_script

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "parallel_4d.py"
TIMEOUT_S = 600  # generous: the suite may share two cores with other work
LOSS_ATOL = 1e-5
WEIGHT_TOL = {"rtol": 1e-5, "atol": 1e-6}
STEPS, SAVED_AT = 6, 3


def _run(argv: list[str], **env: str) -> str:
    """Runs argv from the repository root in its own session; returns stdout, failing the test
    with the output unless it exits 0."""
    environment = clean_env(**env)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        environment.pop(name, None)
    process = subprocess.Popen(
        argv, cwd=ROOT, env=environment, text=True, start_new_session=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # torchrun's ranks too
        out, err = process.communicate()
    assert process.returncode == 0, (
        f"{argv}: exit {process.returncode}\n--- stdout\n{out[-4000:]}\n--- stderr\n{err[-6000:]}"
    )
    return out


def _losses(out: str) -> dict[int, float]:
    losses = {int(s): float(v) for s, v in re.findall(r"^step (\d+) loss (\S+)$", out, re.M)}
    assert losses, f"no losses printed:\n{out}"
    return losses


def _torchrun(nproc: int, *args: str, **env: str) -> dict[int, float]:
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return _losses(_run([*argv, "--nproc-per-node", str(nproc), str(EXAMPLE), *args], **env))


def _forked(nproc: int, output: Path, *args: str, **env: str) -> dict[int, float]:
    """As `_torchrun`, with the ranks forked from a process that has imported torch: the same
    script and environment variables, without 3 CPU-s of imports a rank."""
    return _losses(run_script(EXAMPLE, list(args), nproc, output, **env))


def _assert_matches(got: dict[int, float], want: dict[int, float], steps: range) -> None:
    assert sorted(got) == list(steps), got
    diffs = {step: abs(got[step] - want[step]) for step in steps}
    assert max(diffs.values()) <= LOSS_ATOL, f"got {got}\nwant {want}\ndifferences {diffs}"


@pytest.fixture(scope="module")
def reference() -> dict[int, float]:
    """Single-device losses of steps 0..STEPS-1."""
    return _losses(_run([sys.executable, str(EXAMPLE), "--reference", "--steps", str(STEPS)]))


def test_all_four_dimensions_on_16_ranks(reference: dict[int, float], tmp_path: Path) -> None:
    layout = ("--pp", "2", "--dp", "2", "--cp", "2", "--tp", "2", "--schedule", "1f1b")
    got = _forked(16, tmp_path, *layout, "--steps", str(STEPS), TORCHNEURON_CHIPS="4")
    _assert_matches(got, reference, range(STEPS))


@pytest.mark.parametrize(
    "layout",
    [("--cp", "2", "--tp", "2"), ("--pp", "2", "--cp", "2", "--schedule", "gpipe")],
    ids=["cp2xtp2", "pp2xcp2"],
)
def test_subsets_on_4_ranks(
    reference: dict[int, float], layout: tuple[str, ...], tmp_path: Path
) -> None:
    """cp x tp under torchrun itself (the command examples/README.md shows); pp x cp forked."""
    if layout[0] == "--cp":
        got = _torchrun(4, *layout, "--steps", str(STEPS))
    else:
        got = _forked(4, tmp_path, *layout, "--steps", str(STEPS))
    _assert_matches(got, reference, range(STEPS))


def test_checkpoint_reshards_and_loads_on_cpu(reference: dict[int, float], tmp_path: Path) -> None:
    saved, saved_reference = tmp_path / "dp2xtp2", tmp_path / "reference"
    first = _forked(
        4, tmp_path / "first", "--dp", "2", "--tp", "2", "--steps", str(SAVED_AT),
        "--checkpoint", str(saved),
    )  # fmt: skip
    _assert_matches(first, reference, range(SAVED_AT))
    resumed = _forked(
        4, tmp_path / "resumed", "--pp", "2", "--dp", "2", "--schedule", "gpipe",
        "--load", str(saved), "--steps", str(STEPS),
    )  # fmt: skip
    _assert_matches(resumed, reference, range(SAVED_AT, STEPS))

    # The single-device weights after SAVED_AT steps, to compare the parallel run's with.
    _run([sys.executable, str(EXAMPLE), "--reference", "--steps", str(SAVED_AT),
          "--checkpoint", str(saved_reference)])  # fmt: skip
    code = f"""
        import importlib.util, json, sys
        import torch
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        spec = importlib.util.spec_from_file_location("parallel_4d", {str(EXAMPLE)!r})
        example = importlib.util.module_from_spec(spec)
        sys.modules["parallel_4d"] = example
        spec.loader.exec_module(example)
        states = {{}}
        for name, path in (("parallel", {str(saved)!r}), ("reference", {str(saved_reference)!r})):
            dcp_to_torch_save(path, f"{tmp_path}/{{name}}.pt")
            states[name] = torch.load(f"{tmp_path}/{{name}}.pt", weights_only=False)
        cfg = example.Config()
        model = example.build_model(cfg)
        model.load_state_dict(states["parallel"]["model"])  # strict: every key, no extra one
        inputs, labels = example.batch(cfg, {SAVED_AT})
        with torch.no_grad():
            loss = example.loss_fn(model(inputs), labels).item()
        torch.save(states, "{tmp_path}/states.pt")
        print(json.dumps({{
            "loss": loss, "step": states["parallel"]["step"],
            "neuron_loaded": "torchneuron" in sys.modules,
            "optimizer_keys": sorted(states["parallel"]["optim"]["state"]),
        }}))
    """
    out = _run([sys.executable, "-c", textwrap.dedent(code)], TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    result = json.loads(out.strip().splitlines()[-1])
    assert not result["neuron_loaded"]
    assert result["step"] == SAVED_AT
    assert abs(result["loss"] - reference[SAVED_AT]) <= LOSS_ATOL, (result, reference)

    import torch

    states = torch.load(tmp_path / "states.pt", weights_only=False)
    got, want = states["parallel"], states["reference"]
    assert result["optimizer_keys"] == sorted(want["optim"]["state"])  # momentum of every weight
    assert sorted(got["model"]) == sorted(want["model"])
    for name, tensor in want["model"].items():
        torch.testing.assert_close(got["model"][name], tensor, **WEIGHT_TOL, msg=name)
    for name, state in want["optim"]["state"].items():
        torch.testing.assert_close(
            got["optim"]["state"][name]["momentum_buffer"], state["momentum_buffer"],
            **WEIGHT_TOL, msg=f"momentum of {name}",
        )  # fmt: skip
