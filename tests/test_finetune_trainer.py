"""Transformers `Trainer` on neuron, step losses against the same run on the CPU.

Each test trains the tiny Llama of finetune_fixtures twice from the same weights and seed,
once with `use_cpu=True` and once on the device Trainer picks (neuron:0), and compares the
per-step losses: float32 within FP32_TOL (1e-5 relative), bf16 autocast within BF16_TOL
(1e-2 relative; tests/support/finetune_fixtures.py gives the reasons).
"""

from __future__ import annotations

import shutil
from typing import Any

import pytest
import torch
from support.finetune_fixtures import (
    BF16_TOL,
    FP32_TOL,
    arithmetic_texts,
    assert_losses_close,
    base_model_fixture,  # noqa: F401  (fixture)
    clone,
    eval_losses,
    step_losses,
    tiny_model,
    tokenized_dataset,
    tokenizer_fixture,  # noqa: F401  (fixture)
)


def _trainer(model: torch.nn.Module, tok: Any, out: str, *, cpu: bool, train=None, **kw: Any):
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    settings: dict[str, Any] = dict(
        output_dir=out,
        use_cpu=cpu,
        per_device_train_batch_size=4,
        max_steps=4,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        seed=0,
        report_to=[],
        disable_tqdm=True,
    )
    settings.update(kw)
    pad = settings.pop("pad_to_multiple_of", None)
    collator = DataCollatorForLanguageModeling(tok, mlm=False, pad_to_multiple_of=pad)
    data = train if train is not None else tokenized_dataset(tok, 32)
    return Trainer(
        model=model,
        args=TrainingArguments(**settings),
        train_dataset=data,
        eval_dataset=tokenized_dataset(tok, 8, seed=1),
        data_collator=collator,
    )


def test_default_optimizer_is_fused_adamw_on_neuron_fp32(tok, base, tmp_path):
    """Trainer picks neuron:0 and adamw_torch_fused; the fused kernel runs on the device."""
    cpu = _trainer(clone(base), tok, str(tmp_path), cpu=True)
    cpu.train()
    dev = _trainer(clone(base), tok, str(tmp_path), cpu=False)
    assert dev.args.device == torch.device("neuron", 0)
    assert dev.args.optim == "adamw_torch_fused"
    torch.neuron.clear_op_tracking()
    dev.train()
    assert type(dev.optimizer.optimizer).__name__ == "AdamW"
    assert dev.optimizer.optimizer.defaults["fused"] is True
    assert next(dev.model.parameters()).device.type == "neuron"
    executed = torch.neuron.get_executed_ops()
    assert executed.get("aten::_fused_adamw_", 0) >= 4, sorted(executed)
    assert_losses_close(
        step_losses(dev.state.log_history), step_losses(cpu.state.log_history), FP32_TOL
    )


def test_bf16_accumulation_checkpointing_evaluation(tok, base, tmp_path):
    """bf16 autocast + gradient accumulation + gradient checkpointing + evaluation every 2
    steps: train and eval losses equal the CPU's."""
    kw = dict(
        bf16=True,
        gradient_accumulation_steps=2,
        activation_checkpointing=True,
        per_device_train_batch_size=2,
        eval_strategy="steps",
        eval_steps=2,
        per_device_eval_batch_size=4,
    )
    cpu = _trainer(clone(base), tok, str(tmp_path), cpu=True, **kw)
    cpu.train()
    dev = _trainer(clone(base), tok, str(tmp_path), cpu=False, **kw)
    dev.train()
    assert dev.model.is_activation_checkpointing
    assert len(eval_losses(dev.state.log_history)) == 2
    assert_losses_close(
        step_losses(dev.state.log_history), step_losses(cpu.state.log_history), BF16_TOL
    )
    assert_losses_close(
        eval_losses(dev.state.log_history), eval_losses(cpu.state.log_history), BF16_TOL
    )
    # Autocast was in effect: the same run in float32 gives other losses.
    fp32 = _trainer(clone(base), tok, str(tmp_path), cpu=False, **{**kw, "bf16": False})
    fp32.train()
    assert step_losses(fp32.state.log_history) != step_losses(dev.state.log_history)


def test_resume_from_checkpoint_continues_the_loss_curve(tok, base, tmp_path):
    """A run resumed from checkpoint-2 (weights, optimizer, scheduler, data order) logs the
    same losses for steps 3 and 4 as the uninterrupted run."""
    full = _trainer(clone(base), tok, str(tmp_path), cpu=False, save_strategy="steps", save_steps=2)
    full.train()
    resumed = _trainer(clone(base), tok, str(tmp_path), cpu=False)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    got, expected = step_losses(resumed.state.log_history), step_losses(full.state.log_history)
    assert [e["step"] for e in resumed.state.log_history if "loss" in e] == [1, 2, 3, 4]
    assert got[2:] == expected[2:]  # same device, same kernels: bitwise
    # The restored optimizer state matters: without it step 4 (the first loss after an update
    # from the restored moments) differs, so the check above can fail.
    shutil.copytree(tmp_path / "checkpoint-2", tmp_path / "no-optimizer")
    (tmp_path / "no-optimizer" / "optimizer.pt").unlink()
    bare = _trainer(clone(base), tok, str(tmp_path / "bare"), cpu=False)
    bare.train(resume_from_checkpoint=str(tmp_path / "no-optimizer"))
    assert step_losses(bare.state.log_history)[3] != expected[3]


def test_torch_compile_one_graph_per_padded_shape(tok, base, tmp_path):
    """torch_compile=True (backend "neuron", chosen by Transformers on this device): with
    sequences padded to a multiple of 16, batches of different lengths share one padded shape,
    so Dynamo compiles once and never recompiles; losses equal CPU eager within FP32_TOL."""
    from datasets import Dataset

    texts = arithmetic_texts(32)
    data = Dataset.from_dict({"text": texts}).map(
        lambda r: tok(r["text"] + tok.eos_token), remove_columns=["text"]
    )
    lengths = {len(ids) for ids in data["input_ids"]}
    assert len(lengths) > 1 and max(lengths) <= 16, lengths  # unpadded, shapes would vary
    kw = dict(pad_to_multiple_of=16, dataloader_drop_last=True)
    cpu = _trainer(clone(base), tok, str(tmp_path), cpu=True, train=data, **kw)
    cpu.train()
    torch.neuron.reset_dynamo_metrics()
    dev = _trainer(clone(base), tok, str(tmp_path), cpu=False, train=data, torch_compile=True, **kw)
    assert dev.args.torch_compile_backend == "neuron"
    dev.train()
    metrics = torch.neuron.get_dynamo_metrics()
    assert metrics["compiles"] == 1 and metrics["recompiles"] == 0, metrics
    assert metrics["host_graphs"] == 2, metrics  # forward and backward
    assert_losses_close(
        step_losses(dev.state.log_history), step_losses(cpu.state.log_history), FP32_TOL
    )


_NEURON_RNG_NOT_SAVED = pytest.mark.xfail(
    strict=True,
    reason="Transformers 5.24 Trainer._save_rng_state/_load_rng_state keep the python, numpy, "
    "cpu (and cuda/npu/hpu/mlu/musa/xla) generators only, not the neuron one, so dropout masks "
    "after a resume on neuron differ from the uninterrupted run (on the CPU they match)",
)


@pytest.mark.parametrize(
    "cpu", [True, pytest.param(False, marks=_NEURON_RNG_NOT_SAVED)], ids=["cpu", "neuron"]
)
def test_resume_with_dropout_restores_the_generator(tok, tmp_path, cpu):
    base = tiny_model(tok, attention_dropout=0.3)
    full = _trainer(clone(base), tok, str(tmp_path), cpu=cpu, save_strategy="steps", save_steps=2)
    full.train()
    resumed = _trainer(clone(base), tok, str(tmp_path), cpu=cpu)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert step_losses(resumed.state.log_history)[2:] == step_losses(full.state.log_history)[2:]
