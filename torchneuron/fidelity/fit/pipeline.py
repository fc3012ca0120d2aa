"""Pipeline-parallel steps: one stage of a Transformers decoder and its 1F1B schedule.

A stage keeps a contiguous run of the decoder layers (the first stage also the embedding,
the last the final norm and the LM head) and is driven by PyTorch's ``PipelineStage`` and
``Schedule1F1B`` (``torch.distributed.pipelining``), one stage per rank. The stage's inputs
and outputs are stated when it is built (static metadata), so the schedule needs no
shape-inference pass; the traced prediction and the measurement run this same code.

Under a fake process group one thing cannot run as it is: before its first step the schedule
votes across ranks whether every stage's metadata is static (each stage multiplies its vote
into a tensor received from the previous stage, and reads the result with ``.item()``). A
fake group delivers nothing and a fake tensor has no value, so for the trace the schedule's
warm-up is replaced on that one schedule object by the vote's outcome computed locally: every
rank builds its stage the same way, so every stage votes as this one does.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .step import StepResult, StepSpec, make_optimizer


def stage_layers(num_layers: int, stages: int, stage: int) -> range:
    """The decoder layers of ``stage``: an even split, the first stages taking the remainder."""
    if not 0 <= stage < stages or stages > num_layers:
        raise ValueError(f"cannot place stage {stage} of {stages} on {num_layers} layers")
    base, extra = divmod(num_layers, stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


class DecoderStage(torch.nn.Module):
    """The part of a Llama-style causal LM (``model.model.layers`` ...) one stage runs.

    Takes token ids (first stage) or the hidden states of the previous stage, returns hidden
    states or (last stage) logits. Attention is causal (no mask: the SDPA path's is_causal),
    positions are 0..seq-1 as in the whole model's forward without a cache.
    """

    def __init__(self, model: torch.nn.Module, stage: int, stages: int) -> None:
        super().__init__()
        inner = model.model
        self.config = model.config
        self.first, self.last = stage == 0, stage == stages - 1
        self.embed_tokens = inner.embed_tokens if self.first else None
        kept = stage_layers(len(inner.layers), stages, stage)
        self.layers = torch.nn.ModuleList(inner.layers[i] for i in kept)
        self.rotary_emb = inner.rotary_emb
        self.norm = inner.norm if self.last else None
        self.lm_head = model.lm_head if self.last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(x) if self.embed_tokens is not None else x
        positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        rotary = self.rotary_emb(hidden, position_ids=positions)
        for layer in self.layers:
            hidden = layer(hidden, position_ids=positions, position_embeddings=rotary)
        if self.lm_head is not None and self.norm is not None:
            hidden = self.lm_head(self.norm(hidden))
        return hidden


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy as Transformers computes it (logits in float32)."""
    shifted = F.pad(labels, (0, 1), value=-100)[:, 1:]
    return F.cross_entropy(logits.float().flatten(0, 1), shifted.flatten(), ignore_index=-100)


def microbatches(spec: StepSpec, stages: int) -> int:
    """One microbatch per stage (the fewest 1F1B runs without a bubble-only schedule)."""
    if spec.batch % stages:
        raise ValueError(f"batch {spec.batch} does not split into {stages} microbatches")
    return stages


def build_schedule(
    stage_module: DecoderStage,
    spec: StepSpec,
    stage: int,
    stages: int,
    device: torch.device,
    group: Any,
    fake: bool = False,
) -> Any:
    """The ``PipelineStage`` of ``stage_module`` in a ``Schedule1F1B`` (static metadata)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    count = microbatches(spec, stages)
    rows = spec.batch // count
    config = stage_module.config
    hidden = (rows, spec.seq, config.hidden_size)
    dtype = spec.torch_dtype
    if stage_module.first:
        inputs = torch.zeros(rows, spec.seq, dtype=torch.long, device=device)
    else:
        inputs = torch.empty(hidden, dtype=dtype, device=device, requires_grad=True)
    width = config.vocab_size if stage_module.last else config.hidden_size
    outputs = torch.empty(rows, spec.seq, width, dtype=dtype, device=device, requires_grad=True)
    pipeline_stage = PipelineStage(
        stage_module, stage, stages, device, input_args=inputs, output_args=outputs, group=group
    )
    schedule = Schedule1F1B(pipeline_stage, count, loss_fn=causal_lm_loss)
    if fake:
        schedule._warmup_p2p = _static_warmup  # see the module's docstring
    return schedule


def _static_warmup(stages: list[Any], has_backward: bool, p2p_done: bool) -> None:
    """The outcome of the schedule's cross-rank vote, for ranks that all state their stage's
    metadata: STATIC on every stage."""
    from torch.distributed.pipelining._utils import InferenceMode

    for stage in stages:
        if InferenceMode.needs_dynamic(stage._user_meta, has_backward):
            raise RuntimeError("a fake trace needs each pipeline stage's metadata stated")
        stage._inference_mode = InferenceMode.STATIC


def run_pipeline_step(
    model: DecoderStage, schedule: Any, spec: StepSpec, device: str, tracker: Any = None
) -> StepResult:
    """One training step of this rank's stage: the 1F1B schedule over the replica's batch
    (forward and backward interleave: the whole schedule is the "forward" phase), then the
    optimizer on the stage's parameters."""

    def phase(name: str) -> None:
        if tracker is not None:
            tracker.phase = name

    if not spec.training or spec.grad_checkpointing or spec.autocast:
        raise ValueError("pipeline layouts are traced for plain training steps only")
    model.train()
    phase("inputs")
    ids = torch.randint(0, model.config.vocab_size, (spec.batch, spec.seq), device=device)
    optimizer = make_optimizer(model, spec)
    phase("forward")
    losses: list[torch.Tensor] = []
    if model.first:
        schedule.step(ids)
    elif model.last:
        schedule.step(target=ids, losses=losses)
    else:
        schedule.step()
    phase("optimizer")
    optimizer.step()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    return StepResult(grads, state, [], [optimizer, losses])
