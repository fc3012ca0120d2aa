"""Distributed SFT on neuron: tensor parallel x FSDP from a ``DistributedConfig``.

    torchrun --nproc_per_node=4 examples/sft_distributed.py
    torchrun --nproc_per_node=4 examples/sft_distributed.py --steps 2    # a quick run

Four ranks form a 2 x 2 mesh of neuron devices: each layer's matrices are split across a pair
(tensor parallel, the model's own ``base_model_tp_plan``), and the pairs shard parameters,
gradients and optimizer state between them (FSDP2). ``from_pretrained`` does it all from
``DistributedConfig(tp_size=2, fsdp_size=2)``; TRL's ``SFTTrainer`` trains the sharded model
unchanged. Rank 0 prints the model's sharding, the loss, and the answer accuracy; the checkpoint
``trainer.save_model`` writes is a normal, unsharded one (the main job, ``./scripts/demo.sh
--nproc 4``, reloads it on a plain CPU process).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import warnings

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from transformers import AutoModelForCausalLM
from transformers.distributed import DistributedConfig

from demo import evaluation, task, training
from demo import model as models
from demo.tokenizer import build_tokenizer

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=30, help="training steps")
args = parser.parse_args()

warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
warnings.filterwarnings("ignore", category=FutureWarning)
torch.set_num_threads(1)
training.quiet_libraries()
rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
if world != 4:
    raise SystemExit("run me with: torchrun --nproc_per_node=4 examples/sft_distributed.py")

split = task.make_problems(digits=2, n_train=8_000, n_held_out=100, seed=0)
tokenizer = build_tokenizer()
local = tempfile.mkdtemp(prefix=f"sft-distributed-{rank}-")
models.build_model("tiny", tokenizer, max_length=32, seed=0).save_pretrained(local)
model = AutoModelForCausalLM.from_pretrained(
    local, distributed_config=DistributedConfig(tp_size=2, fsdp_size=2), dtype=torch.float32
)
q_proj = model.model.layers[0].self_attn.q_proj.weight
if rank == 0:
    print(f"device mesh {q_proj.device_mesh}")
    print(
        f"layer 0 q_proj: global {tuple(q_proj.shape)}, placements {q_proj.placements}, "
        f"local shard {tuple(q_proj.to_local().shape)} on {q_proj.to_local().device}"
    )

log_every = min(10, max(1, args.steps // 2))  # 10 as before; short runs log more often
plan = training.TrainingPlan(args.steps, 32, 3e-3, local, log_every=log_every)
curve = training.LossCurve(show_bar=rank == 0)
trainer = training.make_trainer(model, tokenizer, task.as_records(split.train), plan, curve)
trainer.train()
answers = evaluation.answer(training.trained_model(trainer), tokenizer, split.held_out)
if rank == 0:
    print(f"loss {curve.losses[0]:.3f} -> {curve.losses[-1]:.3f} over {plan.steps} steps")
    print(f"held-out accuracy {answers.accuracy(split.held_out):.0%} (more steps: the main job)")
checkpoint = os.path.join(tempfile.gettempdir(), "sft-distributed-checkpoint")
trainer.save_model(checkpoint)
if rank == 0:
    print(f"saved an unsharded checkpoint to {checkpoint}: {sorted(os.listdir(checkpoint))}")
torch.distributed.destroy_process_group()
