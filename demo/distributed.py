"""The main job's TP x FSDP recipe: run under ``torchrun --nproc_per_node=4`` (``--nproc 4``).

Every rank builds the same seeded model and saves it locally; ``from_pretrained(...,
distributed_config=DistributedConfig(tp_size=2, fsdp_size=2))`` then loads it sharded over a
2 x 2 device mesh of neuron devices (tensor parallel within a pair, FSDP2 across pairs), and
``SFTTrainer`` trains it unchanged. Rank 0 prints; the saved checkpoint is checked in a CPU-only
process as in the single-process demo.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from . import evaluation, task, training
from . import model as models
from .arguments import HELD_OUT, parse_args
from .tokenizer import build_tokenizer

TP_SIZE = 2


def main(argv: Sequence[str] | None = None) -> int:
    from transformers import AutoModelForCausalLM
    from transformers.distributed import DistributedConfig

    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world % TP_SIZE or world < 2 * TP_SIZE:
        raise ValueError(f"TP x FSDP needs a multiple of {2 * TP_SIZE} ranks, not {world}")
    fsdp_size = world // TP_SIZE

    def say(line: str) -> None:
        if rank == 0:
            print(line, flush=True)

    torch.set_num_threads(1)
    training.quiet_libraries()
    # Advice for large meshes (sequential collectives of a 2-D mesh) and FSDP2's generic note
    # on views, repeated by every rank: not actionable here.
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
    warnings.filterwarnings("ignore", category=FutureWarning)
    start = time.perf_counter()
    split = task.make_problems(args.digits, 20_000, HELD_OUT, seed=args.seed)
    tokenizer = build_tokenizer()
    scratch = tempfile.mkdtemp(prefix=f"torchneuron-demo-rank{rank}-")
    models.build_model(args.model_size, tokenizer, 64, args.seed).save_pretrained(scratch)
    config = DistributedConfig(tp_size=TP_SIZE, fsdp_size=fsdp_size)
    model = AutoModelForCausalLM.from_pretrained(
        scratch, distributed_config=config, dtype=torch.float32
    )
    say(
        f"{world} ranks: tensor parallel {TP_SIZE} x FSDP {fsdp_size} over neuron devices, "
        f"model on {model.device}"
    )
    before = evaluation.answer(model, tokenizer, split.held_out)
    say(f"accuracy before training: {before.accuracy(split.held_out):.1%}")
    plan = training.TrainingPlan(
        steps=args.steps,
        batch_size=max(1, args.batch_size // fsdp_size),  # the same global batch
        learning_rate=args.learning_rate,
        output_dir=scratch,
        seed=args.seed,
        log_every=max(1, args.steps // 20),
    )
    curve = training.LossCurve(show_bar=rank == 0)
    trainer = training.make_trainer(model, tokenizer, task.as_records(split.train), plan, curve)
    trainer.train()
    say(f"loss {curve.losses[0]:.3f} -> {curve.losses[-1]:.3f}")
    after = evaluation.answer(training.trained_model(trainer), tokenizer, split.held_out)
    say(f"accuracy after training: {after.accuracy(split.held_out):.1%}")
    checkpoint = args.output_dir or os.path.join(tempfile.gettempdir(), "torchneuron-demo-tp-fsdp")
    trainer.save_model(checkpoint)
    status = 0
    if rank == 0:
        tokenizer.save_pretrained(checkpoint)
        reload = evaluation.answer_in_cpu_process(checkpoint, split.held_out)
        same = evaluation.identical_rows(after, reload.answers)
        say(
            f"CPU reload of {checkpoint}: accuracy {reload.answers.accuracy(split.held_out):.1%}, "
            f"identical to the sharded model's answers: {same}/{len(split.held_out)}; "
            f"total {time.perf_counter() - start:.0f} s"
        )
        status = 0 if same == len(split.held_out) else 1
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
