"""Multi-process fine-tuning on neuron devices, against one process with the same global batch.

- `accelerate launch` with 2 processes (DDP over the "neuron" process-group backend, bf16
  autocast) = the same loop in one process;
- 4 ranks as `torchrun --nproc_per_node=4` starts them (forked from a process with torch
  imported: tests/support/ranks.py::run_script; torchrun itself runs examples/sft_distributed.py
  in tests/test_docs.py) with `from_pretrained(dir, distributed_config=
  DistributedConfig(tp_size=2, fsdp_size=2))` + `SFTTrainer`, and tp-only and fsdp-only on
  2 ranks = one neuron process (float32); `trainer.save_model` reloads in a plain CPU process
  (TORCH_DEVICE_BACKEND_AUTOLOAD=0) with the trained model's logits;
- resume from a checkpoint on 2 ranks (DDP) continues the same loss curve.
  Transformers 5.24 refuses to checkpoint the optimizer of a model sharded at load time
  (`Trainer.__init__`: "Resuming is not supported for models sharded at load time"), so
  resume is tested with plain data parallel; DistributedConfig runs save with
  save_only_model (docs/finetuning.md).

Tolerances: float32 losses within FP32_TOL (1e-5 relative; measured ≤ 2e-7: tensor-parallel
row-parallel layers and the gradient reductions add partial sums in another order); bf16
autocast within BF16_TOL (measured ≤ 2e-5: the per-rank matmuls have half the rows, so their
bf16 products round elsewhere, and Adam carries that into later steps). Logits after the CPU
reload within 1e-5 (the same float32 weights, sharded matmuls vs whole ones).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
from support.finetune_fixtures import (
    BF16_TOL,
    FP32_TOL,
    TESTS_DIR,
    assert_losses_close,
    make_tokenizer,
    plain_cpu_env,
    reset_accelerate_state,
    run_interpreter,
    tiny_model,
)
from support.ranks import run_script

DEADLINE_S = 300
LOGITS_TOL = {"rtol": 1e-5, "atol": 1e-5}
SFT_WORKER = str(TESTS_DIR / "support" / "finetune_sft_worker.py")
ACCELERATE_WORKER = str(TESTS_DIR / "support" / "finetune_accelerate_worker.py")


def _ranks(nproc: int, logs: Path, *args: str) -> None:
    """The SFT worker on `nproc` ranks as torchrun starts them, forked from a process that has
    imported torch (tests/support/ranks.py::run_script); its report goes to its output dir."""
    run_script(SFT_WORKER, list(args), nproc, logs)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tiny-llama")
    tok = make_tokenizer()
    tiny_model(tok).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def reference(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The same SFT run in this process on one neuron device, float32."""
    from support.finetune_sft_worker import run_sft

    report = run_sft(model_dir, str(tmp_path_factory.mktemp("reference")))
    assert report["device"] == "neuron:0" and report["world"] == 1
    assert all(shape == [4, 128] for shape in report["shapes"]), report["shapes"]
    return report


def _untrained_logits(model_dir: str) -> torch.Tensor:
    from support.finetune_sft_worker import PROMPT
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = make_tokenizer()(PROMPT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return model(input_ids=ids).logits


def _report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def test_accelerate_launch_two_processes(tmp_path):
    from support.finetune_accelerate_worker import accelerate_losses

    out = tmp_path / "two.json"
    env = dict(os.environ)
    env.pop("LOCAL_RANK", None)
    run_interpreter(
        ["-m", "accelerate.commands.launch", "--num_processes", "2", "--num_machines", "1",
         "--multi_gpu", "--mixed_precision", "bf16", "--dynamo_backend", "no",
         ACCELERATE_WORKER, str(out), "bf16"],
        timeout=DEADLINE_S,
        env=env,
    )  # fmt: skip
    two = json.loads(out.read_text())
    assert two["distributed_type"] == "DistributedType.MULTI_NEURON", two
    assert two["backend"] == "neuron" and two["num_processes"] == 2
    assert two["device"] == "neuron:0"
    reset_accelerate_state()
    try:
        one = accelerate_losses("bf16")
    finally:
        reset_accelerate_state()
    assert one["num_processes"] == 1 and one["device"].startswith("neuron")
    assert_losses_close(two["losses"], one["losses"], BF16_TOL)


def test_tp2_fsdp2_four_ranks_sft_save_and_cpu_reload(model_dir, reference, tmp_path):
    out = tmp_path / "run"
    saved = tmp_path / "saved"
    _ranks(
        4,
        tmp_path / "ranks",
        model_dir,
        str(out),
        "--tp",
        "2",
        "--fsdp",
        "2",
        "--save-model",
        str(saved),
    )
    got = _report(out)
    assert got["world"] == 4 and got["param_device"] == "neuron:0"
    # Each of the 2 data-parallel groups gets half the global batch, padded to 128 tokens.
    assert all(shape == [2, 128] for shape in got["shapes"]), got["shapes"]
    assert_losses_close(got["losses"], reference["losses"], FP32_TOL)

    # The saved checkpoint is an ordinary one: a process without torchneuron loads it.
    load = (
        "import json, sys, torch\n"
        "from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast\n"
        f"sys.path.insert(0, {str(TESTS_DIR)!r})\n"
        "from support.finetune_sft_worker import PROMPT\n"
        f"m = AutoModelForCausalLM.from_pretrained({str(saved)!r}).eval()\n"
        f"tok = PreTrainedTokenizerFast.from_pretrained({str(saved)!r})\n"
        "ids = tok(PROMPT, return_tensors='pt')['input_ids']\n"
        "with torch.no_grad():\n"
        "    logits = m(input_ids=ids).logits\n"
        "assert 'torchneuron' not in sys.modules and not hasattr(torch, 'neuron')\n"
        "print(json.dumps({'device': str(logits.device), 'logits': logits.tolist()}))\n"
    )
    done = run_interpreter(["-c", load], timeout=DEADLINE_S, env=plain_cpu_env())
    cpu = json.loads(done.stdout.strip().splitlines()[-1])
    assert cpu["device"] == "cpu"
    trained = torch.tensor(got["logits"])
    torch.testing.assert_close(torch.tensor(cpu["logits"]), trained, **LOGITS_TOL)
    torch.testing.assert_close(torch.tensor(reference["logits"]), trained, **LOGITS_TOL)
    assert not torch.allclose(_untrained_logits(model_dir), trained, **LOGITS_TOL)  # it trained


@pytest.mark.parametrize(("tp", "fsdp"), [(2, 1), (1, 2)], ids=["tp-only", "fsdp-only"])
def test_two_ranks_sft_equals_one_process(model_dir, reference, tmp_path, tp, fsdp):
    out = tmp_path / "run"
    _ranks(2, tmp_path / "ranks", model_dir, str(out), "--tp", str(tp), "--fsdp", str(fsdp))
    got = _report(out)
    assert got["world"] == 2 and got["param_device"] == "neuron:0"
    assert all(shape == [4 // fsdp, 128] for shape in got["shapes"]), got["shapes"]
    assert_losses_close(got["losses"], reference["losses"], FP32_TOL)
    torch.testing.assert_close(
        torch.tensor(got["logits"]), torch.tensor(reference["logits"]), **LOGITS_TOL
    )


def test_two_ranks_resume_from_checkpoint(model_dir, reference, tmp_path):
    """Plain DDP on 2 ranks: save at step 2, then a new trainer resumes from checkpoint-2
    (weights, optimizer, scheduler, per-rank RNG files, data order) and logs the same losses
    for steps 3 and 4."""
    out = tmp_path / "run"
    _ranks(2, tmp_path / "ranks", model_dir, str(out), "--save-steps", "2", "--check-resume")
    got = _report(out)
    assert (out / "checkpoint-2" / "optimizer.pt").is_file()
    assert sorted(p.name for p in (out / "checkpoint-2").glob("rng_state_*.pth")) == [
        "rng_state_0.pth",
        "rng_state_1.pth",
    ]
    assert got["resumed_steps"] == [1, 2, 3, 4]
    assert got["resumed_losses"][2:] == got["losses"][2:]
    assert_losses_close(got["losses"], reference["losses"], FP32_TOL)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
