"""One SFT run of the tiny Llama for tests/test_finetune_distributed.py.

Started by `torchrun` (any number of ranks, `--tp` × `--fsdp` = world size) or as a plain
process (one rank, no DistributedConfig: the single-device reference). It trains a few steps
with `SFTTrainer` (packing="wrapped", float32), and rank 0 writes a JSON report: the step
losses, the trained model's logits on a fixed prompt, and the batch shapes it saw.

    python finetune_sft_worker.py MODEL_DIR OUT_DIR [--tp N --fsdp M] [--save-steps K]
        [--save-model DIR] [--check-resume]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/
from support.finetune_fixtures import make_tokenizer, step_losses, text_dataset  # noqa: E402

GLOBAL_BATCH = 4
STEPS = 4
PROMPT = "12+34=46\n7+8="


def full(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's whole value (every rank's shards), or the tensor itself."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def run_sft(
    model_dir: str,
    out_dir: str,
    *,
    tp: int = 1,
    fsdp: int = 1,
    save_steps: int = 0,
    resume: str | None = None,
    save_model: str | None = None,
    cpu: bool = False,
) -> dict:
    """Trains STEPS steps; returns the report (losses, logits on PROMPT, batch shapes)."""
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer

    world = int(os.environ.get("WORLD_SIZE", "1"))
    sharded = tp * fsdp > 1
    if sharded:
        from transformers.distributed import DistributedConfig

        assert tp * fsdp == world, (tp, fsdp, world)
        config = DistributedConfig(tp_size=tp, fsdp_size=fsdp)
        model = AutoModelForCausalLM.from_pretrained(model_dir, distributed_config=config)
    else:  # one process, or plain data parallel (DDP) across the ranks
        model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = make_tokenizer()
    args = SFTConfig(
        output_dir=out_dir,
        use_cpu=cpu,
        per_device_train_batch_size=GLOBAL_BATCH // (fsdp if sharded else world),
        max_steps=STEPS,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500,
        # Transformers 5.24 cannot checkpoint the optimizer of a model sharded at load time
        save_only_model=sharded,
        seed=0,
        bf16=False,
        packing=True,
        packing_strategy="wrapped",
        max_length=64,
        pad_to_multiple_of=128,  # what neuron gets automatically; the CPU reference too
        report_to=[],
        disable_tqdm=True,
    )
    trainer = SFTTrainer(
        model=model, args=args, train_dataset=text_dataset(64), processing_class=tok
    )
    shapes: list[list[int]] = []
    collate = trainer.data_collator

    def recording_collator(examples: list) -> dict:
        batch = collate(examples)
        shapes.append(list(batch["input_ids"].shape))
        return batch

    trainer.data_collator = recording_collator
    trainer.train(resume_from_checkpoint=resume)
    if save_model:
        trainer.save_model(save_model)

    model.eval()
    ids = tok(PROMPT, return_tensors="pt")["input_ids"].to(trainer.args.device)
    with torch.no_grad():
        logits = full(model(input_ids=ids).logits).float().cpu()
    return {
        "world": world,
        "device": str(trainer.args.device),
        "param_device": str(next(model.parameters()).device),
        "losses": step_losses(trainer.state.log_history),
        "steps": [e["step"] for e in trainer.state.log_history if "loss" in e],
        "logits": logits.tolist(),
        "shapes": shapes,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("model_dir")
    p.add_argument("out_dir")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--fsdp", type=int, default=1)
    p.add_argument("--save-steps", type=int, default=0)
    p.add_argument("--save-model", default=None)
    p.add_argument("--check-resume", action="store_true", help="then resume from checkpoint-2")
    a = p.parse_args()
    report = run_sft(
        a.model_dir,
        a.out_dir,
        tp=a.tp,
        fsdp=a.fsdp,
        save_steps=a.save_steps,
        save_model=a.save_model,
    )
    if a.check_resume:
        resumed = run_sft(a.model_dir, a.out_dir, resume=str(Path(a.out_dir) / "checkpoint-2"))
        report["resumed_losses"] = resumed["losses"]
        report["resumed_steps"] = resumed["steps"]
    if int(os.environ.get("RANK", "0")) == 0:
        Path(a.out_dir).mkdir(parents=True, exist_ok=True)
        (Path(a.out_dir) / "report.json").write_text(json.dumps(report))
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
