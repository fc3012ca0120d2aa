"""4-D parallel training on neuron composed from PyTorch's own APIs, as TorchTitan does.

    torchrun --nproc-per-node 4 examples/parallel_4d.py --dp 2 --tp 2
    torchrun --nproc-per-node 4 examples/parallel_4d.py --pp 2 --cp 2 --checkpoint /tmp/ckpt
    torchrun --nproc-per-node 4 examples/parallel_4d.py --pp 2 --dp 2 --load /tmp/ckpt
    TORCHNEURON_CHIPS=2 torchrun --nproc-per-node 8 examples/parallel_4d.py --pp 2 --dp 2 --cp 2
    TORCHNEURON_CHIPS=4 torchrun --nproc-per-node 16 examples/parallel_4d.py \
        --pp 2 --dp 2 --cp 2 --tp 2
    python examples/parallel_4d.py --reference          # the same training on one device

A small Llama-style decoder (embedding, blocks of RMSNorm + rotary causal attention + SwiGLU
MLP, final norm, LM head) trains on synthetic sequences (token = start + k * position, mod the
vocabulary) with SGD. The ranks form a device mesh (pp, dp_shard, cp, tp), innermost last:

- tp: ``parallelize_module`` splits each block's q/k/v and w1/w3 by output features
  (ColwiseParallel: each rank holds n_heads / tp heads) and wo/w2 by input features
  (RowwiseParallel, whose output is summed over tp); the embedding is split by vocabulary and
  the LM head by output features (logits gathered). The weights become DTensors on mesh "tp".
- cp: ``context_parallel(mesh["cp"], buffers=[inputs, labels, cos, sin])`` shards the batch
  and the rotary caches along the sequence (head-tail load balanced for causal attention) and
  turns ``F.scaled_dot_product_attention`` into ring attention over the cp ranks, for the
  forward and the backward run inside it.
- dp_shard: ``fully_shard`` on every block and on the stage's root over the flattened
  ("dp_shard", "cp") mesh: the cp ranks see other tokens of the same sequences, so their
  gradients are averaged with the data-parallel ones (TorchTitan's dp_shard_cp). TP's DTensor
  weights become 2-D DTensors (Shard over dp_shard_cp, Shard over tp).
- pp: each pipeline rank keeps only its layers (layer names are kept, so checkpoints have the
  same keys under any layout); a ``PipelineStage`` per rank and a schedule (GPipe or 1F1B)
  split the local batch into microbatches. The loss (a mean per microbatch) lives on the last
  stage; the schedule divides the accumulated gradients by the number of microbatches.

Each rank's loss is the mean over its tokens, so the mean over dp and cp ranks of these
(equal token counts) is the global mean: rank 0 prints it as ``step N loss X``. ``--reference``
trains the same model on the same global batches on one device. ``--checkpoint DIR`` saves
model and optimizer with torch.distributed.checkpoint (DCP) at the end, ``--load DIR`` loads
them (under any layout, or none) and continues from the saved step.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.experimental import context_parallel
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)


@dataclass(frozen=True)
class Config:
    dim: int = 64
    n_heads: int = 4
    n_layers: int = 4
    hidden: int = 128  # SwiGLU width
    vocab: int = 128
    seq: int = 64
    batch: int = 8  # global batch, split over dp_shard ranks


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary_cache(cfg: Config) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape (seq, head_dim): the sequence is dimension 0."""
    half = cfg.dim // cfg.n_heads // 2
    inv_freq = 1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float32) / half))
    angles = torch.outer(torch.arange(cfg.seq, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x (batch, seq, heads, head_dim)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos[:, None] + torch.cat([-x2, x1], dim=-1) * sin[:, None]


class Attention(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.head_dim = cfg.dim // cfg.n_heads
        self.wq, self.wk, self.wv, self.wo = (
            nn.Linear(cfg.dim, cfg.dim, bias=False) for _ in range(4)
        )

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape  # s: this cp rank's share of the sequence
        # -1: the heads this tp rank holds
        q, k, v = (w(x).view(b, s, -1, self.head_dim) for w in (self.wq, self.wk, self.wv))
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.w2 = nn.Linear(cfg.hidden, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.attention_norm, self.attention = RMSNorm(cfg.dim), Attention(cfg)
        self.ffn_norm, self.feed_forward = RMSNorm(cfg.dim), FeedForward(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    """The whole model, or one pipeline stage of it (absent parts are None)."""

    def __init__(self, cfg: Config) -> None:
        super().__init__()
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.n_layers)})
        self.norm: RMSNorm | None = RMSNorm(cfg.dim)
        self.output: nn.Linear | None = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        cos, sin = rotary_cache(cfg)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(h)
        for layer in self.layers.values():
            h = layer(h, self.cos, self.sin)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h


def build_model(cfg: Config) -> Transformer:
    torch.manual_seed(0)  # the same initial weights in every process and layout
    return Transformer(cfg)


def batch(cfg: Config, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of `step`: inputs and labels (the next tokens), (batch, seq) each."""
    g = torch.Generator().manual_seed(1000 + step)
    start = torch.randint(0, cfg.vocab, (cfg.batch, 1), generator=g)
    stride = torch.randint(1, 8, (cfg.batch, 1), generator=g)
    tokens = (start + stride * torch.arange(cfg.seq + 1)) % cfg.vocab
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


def make_optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    # SGD's update is proportional to the gradient, so a gradient scaled wrongly (a division
    # by the microbatches or the ranks missing or repeated) changes the losses; Adam's would not
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


def save(path: str, model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd, "step": step}, checkpoint_id=path)


def load(path: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Loads `path` into this rank's shards of model and optimizer; returns the saved step."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "step": 0}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    return int(state["step"])


def split_stage(model: Transformer, stage: int, stages: int) -> None:
    """Keeps this pipeline stage's consecutive layers, the embedding on the first stage, and
    the final norm and head on the last."""
    per = len(model.layers) // stages
    for name in list(model.layers):
        if not stage * per <= int(name) < (stage + 1) * per:
            del model.layers[name]
    if stage != 0:
        model.tok_embeddings = None
    if stage != stages - 1:
        model.norm, model.output = None, None


def apply_tp(model: Transformer, tp_mesh: DeviceMesh) -> None:
    plan: dict[str, ParallelStyle] = {}
    if model.tok_embeddings is not None:  # split by vocabulary; output summed over tp
        plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate())
    if model.output is not None:  # split by vocabulary; logits gathered
        plan["output"] = ColwiseParallel(output_layouts=Replicate())
    parallelize_module(model, tp_mesh, plan)
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, {
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(),
        })  # fmt: skip


def apply_fsdp(model: Transformer, dp_mesh: DeviceMesh, pipelined: bool) -> None:
    # With pipelining, keeping parameters gathered between microbatches saves an all-gather
    # per microbatch (TorchTitan does the same).
    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=not pipelined)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=not pipelined)


def train_reference(cfg: Config, args: argparse.Namespace) -> None:
    model = build_model(cfg).to("neuron")
    optimizer = make_optimizer(model, args.lr)
    start = load(args.load, model, optimizer) if args.load else 0
    for step in range(start, args.steps):
        inputs, labels = (t.to("neuron") for t in batch(cfg, step))
        loss = loss_fn(model(inputs), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item():.8f}", flush=True)
    if args.checkpoint:
        save(args.checkpoint, model, optimizer, args.steps)


def train_parallel(cfg: Config, args: argparse.Namespace) -> None:
    pp, dp, cp, tp = args.pp, args.dp, args.cp, args.tp
    world = int(os.environ["WORLD_SIZE"])
    if pp * dp * cp * tp != world:
        raise SystemExit(f"--pp {pp} --dp {dp} --cp {cp} --tp {tp}: product is not {world}")
    # init_device_mesh starts the "neuron" process group, which binds LOCAL_RANK's device
    mesh = init_device_mesh(
        "neuron", (pp, dp, cp, tp), mesh_dim_names=("pp", "dp_shard", "cp", "tp")
    )
    device = torch.device("neuron", torch.neuron.current_device())
    dp_cp_mesh = mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
    pp_rank, dp_rank = mesh["pp"].get_local_rank(), mesh["dp_shard"].get_local_rank()
    first, last = pp_rank == 0, pp_rank == pp - 1

    model = build_model(cfg)
    if pp > 1:
        split_stage(model, pp_rank, pp)
    model.to(device)
    if tp > 1:
        apply_tp(model, mesh["tp"])
    if dp * cp > 1:
        apply_fsdp(model, dp_cp_mesh, pipelined=pp > 1)
    optimizer = make_optimizer(model, args.lr)
    start = load(args.load, model, optimizer) if args.load else 0
    if pp > 1:
        stage = PipelineStage(model, pp_rank, pp, device, group=mesh["pp"].get_group())
        schedule_class = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[args.schedule]
        schedule = schedule_class(stage, n_microbatches=args.microbatches, loss_fn=loss_fn)

    rows = cfg.batch // dp
    for step in range(start, args.steps):
        inputs, labels = (
            t[dp_rank * rows : (dp_rank + 1) * rows].to(device) for t in batch(cfg, step)
        )
        context: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if cp > 1:  # shards these in place for the duration (the rotary caches are restored)
            context = context_parallel(
                mesh["cp"],
                buffers=[inputs, labels, model.cos, model.sin],
                buffer_seq_dims=[1, 1, 0, 0],
                no_restore_buffers={inputs, labels},
            )
        with context:
            if pp == 1:
                loss = loss_fn(model(inputs), labels)
                loss.backward()
            else:
                losses: list[torch.Tensor] = []
                if first:
                    schedule.step(inputs)
                else:
                    schedule.step(target=labels if last else None, losses=losses)
                loss = torch.stack(losses).mean() if last else torch.zeros((), device=device)
        optimizer.step()
        optimizer.zero_grad()
        # the mean over dp and cp ranks of the last stage; tp ranks hold equal copies
        total = loss.detach().clone()
        dist.all_reduce(total)
        if dist.get_rank() == 0:
            print(f"step {step} loss {total.item() / (dp * cp * tp):.8f}", flush=True)
    if args.checkpoint:
        save(args.checkpoint, model, optimizer, args.steps)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for dim in ("pp", "dp", "cp", "tp"):
        parser.add_argument(f"--{dim}", type=int, default=1, help=f"{dim} mesh dimension size")
    parser.add_argument("--steps", type=int, default=6, help="train until this step")
    parser.add_argument("--lr", type=float, default=0.5, help="SGD learning rate")
    parser.add_argument("--microbatches", type=int, default=2, help="pipeline microbatches")
    parser.add_argument("--schedule", choices=("gpipe", "1f1b"), default="1f1b")
    parser.add_argument("--reference", action="store_true", help="one device, no parallelism")
    parser.add_argument("--checkpoint", help="save a DCP checkpoint here at the end")
    parser.add_argument("--load", help="load this DCP checkpoint before training")
    args = parser.parse_args()
    cfg = Config()
    torch.set_num_threads(1)
    # The logits gathered over tp are a view; nothing modifies them in place.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view")
    if args.reference:
        train_reference(cfg, args)
    else:
        train_parallel(cfg, args)


if __name__ == "__main__":
    main()
