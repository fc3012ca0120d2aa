"""An Accelerate training loop and PEFT LoRA on neuron, against the same run on the CPU.

Tolerances: float32 step losses within FP32_TOL (1e-5 relative), bf16 autocast within
BF16_TOL (1e-2 relative). Logits of a reloaded or merged LoRA model equal the
trained adapter model's within 1e-5 (merging adds B·A·scale into W, a different rounding of
the same sum).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from support.finetune_fixtures import (
    BF16_TOL,
    FP32_TOL,
    assert_losses_close,
    clone,
    reset_accelerate_state,
    step_losses,
    tiny_model,
    tokenized_dataset,
    tokenizer_fixture,  # noqa: F401  (fixture)
)

LOGITS_TOL = {"rtol": 1e-5, "atol": 1e-5}


@pytest.fixture(autouse=True)
def _fresh_accelerate_state() -> Any:
    yield
    reset_accelerate_state()


def _loader(tok: Any, batch: int = 4) -> torch.utils.data.DataLoader:
    from transformers import DataCollatorForLanguageModeling

    collator = DataCollatorForLanguageModeling(tok, mlm=False)
    return torch.utils.data.DataLoader(
        tokenized_dataset(tok, 16), batch_size=batch, collate_fn=collator
    )


def _accelerate_losses(model: torch.nn.Module, tok: Any, *, cpu: bool, steps: int = 4) -> tuple:
    """A plain Accelerate loop (bf16 autocast, AdamW); returns losses and the Accelerator."""
    from accelerate import Accelerator

    reset_accelerate_state()
    acc = Accelerator(mixed_precision="bf16", cpu=cpu)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer, loader = acc.prepare(model, optimizer, _loader(tok))
    losses = []
    for step, batch in enumerate(loader):
        if step == steps:
            break
        loss = model(**batch).loss
        acc.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, acc, model, optimizer


def test_accelerator_bf16_loop_matches_cpu(tok):
    base = tiny_model(tok)
    cpu_losses, _, _, _ = _accelerate_losses(clone(base), tok, cpu=True)
    losses, acc, model, _ = _accelerate_losses(clone(base), tok, cpu=False)
    assert acc.device.type == "neuron"
    assert acc.mixed_precision == "bf16"
    assert next(model.parameters()).device.type == "neuron"
    assert_losses_close(losses, cpu_losses, BF16_TOL)


def test_accelerator_state_restores_the_neuron_generator(tok, tmp_path):
    """save_state / load_state carry the neuron RNG (Accelerate names it torch_neuron_manual_
    seed): with dropout, the steps after a restore draw the same masks and give the same
    losses as the steps after the save."""
    from accelerate import Accelerator

    reset_accelerate_state()
    acc = Accelerator()
    model = tiny_model(tok, attention_dropout=0.3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = acc.prepare(model, optimizer)
    batch = {k: v.to(acc.device) for k, v in next(iter(_loader(tok))).items()}

    def steps(n: int) -> list[float]:
        out = []
        for _ in range(n):
            loss = model(**batch).loss
            acc.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            out.append(loss.item())
        return out

    torch.manual_seed(1)
    steps(2)
    acc.save_state(str(tmp_path))
    after_save = steps(3)
    torch.neuron.manual_seed(12345)  # disturb the generator; load_state must put it back
    acc.load_state(str(tmp_path))
    assert steps(3) == after_save
    # Dropout draws from the neuron generator: a different state gives other losses.
    acc.load_state(str(tmp_path))
    torch.neuron.manual_seed(12345)
    assert steps(3) != after_save


def _lora_trainer(model: torch.nn.Module, tok: Any, out: str, *, cpu: bool):
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=out,
        use_cpu=cpu,
        per_device_train_batch_size=4,
        max_steps=4,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        seed=0,
        report_to=[],
        disable_tqdm=True,
    )
    collator = DataCollatorForLanguageModeling(tok, mlm=False)
    return Trainer(
        model=model, args=args, train_dataset=tokenized_dataset(tok, 32), data_collator=collator
    )


def test_peft_lora_train_save_reload_merge(tok, tmp_path):
    import peft

    base = tiny_model(tok)
    config = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0
    )
    runs = {}
    for cpu in (True, False):
        torch.manual_seed(1)  # LoRA's A matrices are drawn from the CPU generator
        model = peft.get_peft_model(clone(base), config)
        trainer = _lora_trainer(model, tok, str(tmp_path / f"run{cpu}"), cpu=cpu)
        trainer.train()
        runs[cpu] = (model, step_losses(trainer.state.log_history))
    model, losses = runs[False]
    assert next(model.parameters()).device.type == "neuron"
    assert_losses_close(losses, runs[True][1], FP32_TOL)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)

    ids = tok("12+34=46\n7+8=", return_tensors="pt")["input_ids"]
    model.eval()
    with torch.no_grad():
        trained = model(input_ids=ids.to("neuron")).logits.cpu()
    model.save_pretrained(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()

    reloaded = peft.PeftModel.from_pretrained(clone(base).to("neuron"), tmp_path / "adapter").eval()
    with torch.no_grad():
        again = reloaded(input_ids=ids.to("neuron")).logits.cpu()
    torch.testing.assert_close(again, trained, rtol=0, atol=0)  # same weights, same kernels
    merged = reloaded.merge_and_unload()
    assert not any("lora_" in n for n, _ in merged.named_parameters())
    with torch.no_grad():
        merged_logits = merged(input_ids=ids.to("neuron")).logits.cpu()
        untrained = base(input_ids=ids).logits
    torch.testing.assert_close(merged_logits, trained, **LOGITS_TOL)
    assert not torch.allclose(untrained, trained, **LOGITS_TOL)  # the adapter changed the model
