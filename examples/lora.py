"""LoRA fine-tuning with PEFT on neuron: train adapters, save them, reload, merge.

    python examples/lora.py
    python examples/lora.py --base-steps 2 --lora-steps 2     # a quick run (the suite's)

A small Llama (built from a config, random weights; no download) first trains on two-digit
addition for a few steps to serve as a "base model"; LoRA adapters (rank 8 on the attention
projections) are then trained on neuron with TRL's SFTTrainer while the base weights stay
frozen. The adapters are saved (a few hundred KB), reloaded onto a fresh copy of the base model,
and merged into its weights with ``merge_and_unload``; the script checks that the trained
and the reloaded-and-merged models give the same logits and answers, and prints the losses.
(Learning addition well takes ~400 steps: that is the main job, ``./scripts/demo.sh``.)
"""

from __future__ import annotations

import argparse
import copy
import os
import tempfile

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from peft import LoraConfig, PeftModel, get_peft_model

from demo import evaluation, task, training
from demo import model as models
from demo.tokenizer import build_tokenizer

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--base-steps", type=int, default=60, help="base model's training steps")
parser.add_argument("--lora-steps", type=int, default=80, help="LoRA adapters' training steps")
args = parser.parse_args()

torch.set_num_threads(1)
training.quiet_libraries()
split = task.make_problems(digits=2, n_train=8_000, n_held_out=100, seed=0)
tokenizer = build_tokenizer()
base = models.build_model("tiny", tokenizer, max_length=32, seed=0).to("neuron")
scratch = tempfile.mkdtemp(prefix="lora-example-")


def train(model: torch.nn.Module, steps: int, learning_rate: float) -> list[float]:
    """Trains `model` in place; returns the losses. Accelerate wraps the model's forward in
    bf16 autocast during training and leaves the wrapper on; it is removed here, or a copy
    or PEFT wrapper of the model would call the wrapped forward of the original object."""
    plan = training.TrainingPlan(steps, 64, learning_rate, scratch, log_every=max(1, steps // 5))
    curve = training.LossCurve()
    trainer = training.make_trainer(model, tokenizer, task.as_records(split.train), plan, curve)
    trainer.train()
    assert training.trained_model(trainer) is model  # unwrapped in place
    return curve.losses


print(f"1. base model: full training on neuron, {args.base_steps} steps")
losses = train(base, args.base_steps, 3e-3)
print(f"   loss {losses[0]:.3f} -> {losses[-1]:.3f}")

print("2. LoRA adapters (rank 8, q/k/v/o projections) trained on neuron, base frozen")
frozen_base = copy.deepcopy(base)
ids = tokenizer([p.prompt for p in split.held_out], return_tensors="pt", add_special_tokens=False)
ids = ids["input_ids"].to("neuron")
with torch.no_grad():
    base_logits = base.eval()(ids).logits.cpu()
lora = get_peft_model(
    base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
)
trainable = sum(p.numel() for p in lora.parameters() if p.requires_grad)
total = sum(p.numel() for p in lora.parameters())
print(f"   trainable parameters: {trainable} of {total} ({trainable / total:.1%})")
losses = train(lora, args.lora_steps, 3e-3)
lora_answers = evaluation.answer(lora, tokenizer, split.held_out)
print(f"   loss {losses[0]:.3f} -> {losses[-1]:.3f}")

adapter_dir = os.path.join(scratch, "adapter")
lora.save_pretrained(adapter_dir)
size = sum(os.path.getsize(os.path.join(adapter_dir, f)) for f in os.listdir(adapter_dir))
print(f"3. saved the adapters to {adapter_dir} ({size / 1024:.0f} KiB)")

reloaded = PeftModel.from_pretrained(frozen_base, adapter_dir).to("neuron").eval()
merged = reloaded.merge_and_unload()  # plain LlamaForCausalLM with the adapters folded in
lora.eval()
with torch.no_grad():
    trained_logits = lora(ids).logits.cpu()
    merged_logits = merged(ids).logits.cpu()
diff = (trained_logits - merged_logits).abs().max().item()
moved = (trained_logits - base_logits).abs().max().item()
merged_answers = evaluation.answer(merged, tokenizer, split.held_out)
same = evaluation.identical_rows(lora_answers, merged_answers)
print(
    f"4. reloaded + merge_and_unload: a plain {type(merged).__name__}; max |logits trained - "
    f"merged| = {diff:.2g} (tolerance 1e-3: merging re-associates float32 sums); greedy "
    f"answers identical on {same}/{len(split.held_out)} held-out problems"
)
print(f"   the adapters move the base model's logits by up to {moved:.2g}")
assert moved > 10 * diff, (moved, diff)  # the comparison above is of two trained models
assert diff < 1e-3, diff
print("OK")
