"""TRL `SFTTrainer` on neuron against the same run on the CPU.

TRL ≥ 1.16 pads batches to a multiple of 128 tokens when the trainer's device is neuron
(`SFTConfig.__post_init__`: `pad_to_multiple_of="auto"` → 128 if `self.device.type ==
"neuron"`), so a compiled model sees few shapes. The CPU reference is given the same padding
explicitly, so both runs compute on the same shapes: bf16 autocast (SFTConfig's default) within
BF16_TOL, float32 within FP32_TOL.
"""

from __future__ import annotations

from typing import Any

import torch
from support.finetune_fixtures import (
    BF16_TOL,
    FP32_TOL,
    assert_losses_close,
    base_model_fixture,  # noqa: F401  (fixture)
    clone,
    step_losses,
    text_dataset,
    tokenizer_fixture,  # noqa: F401  (fixture)
)


def _sft(model: torch.nn.Module, tok: Any, out: str, *, cpu: bool, **kw: Any):
    """An SFTTrainer with packing="wrapped" whose collator records each batch's shape."""
    from trl import SFTConfig, SFTTrainer

    settings: dict[str, Any] = dict(
        output_dir=out,
        use_cpu=cpu,
        per_device_train_batch_size=2,
        max_steps=4,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        seed=0,
        packing=True,
        packing_strategy="wrapped",
        max_length=64,
        dataloader_drop_last=True,  # the last packed batch has one row
        report_to=[],
        disable_tqdm=True,
    )
    settings.update(kw)
    trainer = SFTTrainer(
        model=model,
        args=SFTConfig(**settings),
        train_dataset=text_dataset(48),
        processing_class=tok,
    )
    collate = trainer.data_collator
    trainer.batch_shapes = []

    def recording_collator(examples: list) -> dict:
        batch = collate(examples)
        trainer.batch_shapes.append(tuple(batch["input_ids"].shape))
        return batch

    trainer.data_collator = recording_collator
    return trainer


def test_sft_packing_pads_to_128_on_neuron(tok, base, tmp_path):
    dev = _sft(clone(base), tok, str(tmp_path), cpu=False)
    assert dev.args.device.type == "neuron"
    assert dev.args.pad_to_multiple_of == 128  # chosen by TRL for neuron
    assert dev.args.bf16  # SFTConfig's default
    dev.train()
    assert next(dev.model.parameters()).device.type == "neuron"
    # max_length=64 packed rows, padded to 128 on neuron (64 on the CPU by default).
    assert dev.batch_shapes and all(s[1] == 128 for s in dev.batch_shapes), dev.batch_shapes
    plain_cpu = _sft(clone(base), tok, str(tmp_path), cpu=True)
    assert plain_cpu.args.pad_to_multiple_of is None
    cpu = _sft(clone(base), tok, str(tmp_path), cpu=True, pad_to_multiple_of=128)
    cpu.train()
    assert_losses_close(
        step_losses(dev.state.log_history), step_losses(cpu.state.log_history), BF16_TOL
    )


def test_sft_torch_compile_compiles_once(tok, base, tmp_path):
    """torch_compile=True: every packed batch has the padded shape (2, 128), so everything is
    compiled during the first step and nothing after it (no recompiles); float32 losses equal
    CPU eager. TRL's chunked NLL loss (trl/kernels/chunked_logprob.py) calls
    `torch.mm(..., out=tile)` with a non-contiguous `tile`, which Dynamo does not trace (a graph
    break, on any device), so one step is several graphs rather than one."""
    from transformers import TrainerCallback

    after_first_step: dict = {}

    class FirstStepMetrics(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            if state.global_step == 1:
                after_first_step.update(torch.neuron.get_dynamo_metrics())

    cpu = _sft(clone(base), tok, str(tmp_path), cpu=True, pad_to_multiple_of=128, bf16=False)
    cpu.train()
    torch.neuron.reset_dynamo_metrics()
    dev = _sft(clone(base), tok, str(tmp_path), cpu=False, bf16=False, torch_compile=True)
    assert dev.args.torch_compile_backend == "neuron"
    dev.add_callback(FirstStepMetrics())
    dev.train()
    metrics = torch.neuron.get_dynamo_metrics()
    assert set(dev.batch_shapes) == {(2, 128)}, dev.batch_shapes
    assert after_first_step["compiles"] >= 1 and after_first_step["host_graphs"] >= 2
    for key in ("compiles", "host_graphs", "unique_graphs"):
        assert metrics[key] == after_first_step[key], (key, metrics, after_first_step)
    assert metrics["recompiles"] == 0 and metrics["dynamo_recompiles"] == 0, metrics
    assert_losses_close(
        step_losses(dev.state.log_history), step_losses(cpu.state.log_history), FP32_TOL
    )
