"""One training or inference step, the same code for a fake trace and a real run.

The fit prediction and its check run this very function: under FakeTensorMode (nothing
allocated) for the prediction, on the device for the measurement.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}


@dataclass(frozen=True)
class StepSpec:
    """What one step does, per model replica (batch is the replica's micro-batch)."""

    batch: int = 1
    seq: int = 128
    training: bool = True
    dtype: str = "fp32"  # parameter dtype
    autocast: bool = False  # bf16 autocast around the forward
    optimizer: str = "adamw"
    grad_checkpointing: bool = False
    new_tokens: int = 1  # inference: tokens decoded after the prefill, into a static KV cache

    def __post_init__(self) -> None:
        if self.batch < 1 or self.seq < 1:
            raise ValueError(f"batch and seq must be >= 1, got batch={self.batch}, seq={self.seq}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        if self.optimizer not in ("adamw", "sgd"):
            raise ValueError(f"optimizer must be 'adamw' or 'sgd', got {self.optimizer!r}")
        if not self.training and self.new_tokens < 1:
            raise ValueError(f"new_tokens must be >= 1 for inference, got {self.new_tokens}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @property
    def tokens(self) -> int:
        return self.batch * (self.seq if self.training else self.seq + self.new_tokens)


@dataclass
class StepResult:
    """The tensors alive after the step, by what they are (for the breakdown)."""

    gradients: list[torch.Tensor]
    optimizer_state: list[torch.Tensor]
    kv_cache: list[torch.Tensor]
    keep: list[Any]  # objects holding the above alive until the caller is done


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside a wrapper such as DistributedDataParallel (which has ``module``)."""
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, torch.nn.Module) else model


def _set_phase(tracker: Any, phase: str) -> None:
    if tracker is not None:
        tracker.phase = phase


def make_optimizer(model: torch.nn.Module, spec: StepSpec) -> torch.optim.Optimizer:
    from torch.utils._foreach_utils import _get_foreach_kernels_supported_devices
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    params = [p for p in model.parameters() if p.requires_grad]
    # The default implementation PyTorch picks for real tensors of this device. Stated
    # explicitly because a fake tensor is not a plain Tensor, and PyTorch would pick the
    # per-tensor loop for it, whose temporaries are one parameter's, not all of them.
    foreach = bool(params) and params[0].device.type in _get_foreach_kernels_supported_devices()
    # One group per kind of parameter: a foreach op refuses a list that mixes DTensors
    # (tensor-parallel projections) with plain tensors (the embeddings and norms).
    kinds: dict[bool, list[torch.nn.Parameter]] = {}
    for p in params:
        kinds.setdefault(is_traceable_wrapper_subclass(p), []).append(p)
    groups: Any = [{"params": group} for group in kinds.values()] if len(kinds) > 1 else params
    if spec.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=1e-4, foreach=foreach)
    return torch.optim.SGD(groups, lr=1e-4, momentum=0.9, foreach=foreach)


def run_step(
    model: torch.nn.Module, spec: StepSpec, device: str = "neuron", tracker: Any = None
) -> StepResult:
    """Runs one step of ``spec`` on ``model`` (already on ``device``)."""
    vocab = unwrapped(model).config.vocab_size
    autocast = (
        torch.autocast(device.split(":")[0], dtype=torch.bfloat16)
        if spec.autocast
        else contextlib.nullcontext()
    )
    _set_phase(tracker, "inputs")
    ids = torch.randint(0, vocab, (spec.batch, spec.seq), device=device)
    if spec.training:
        model.train()
        if spec.grad_checkpointing:
            unwrapped(model).gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
        optimizer = make_optimizer(model, spec)
        _set_phase(tracker, "forward")
        with autocast:
            loss = model(input_ids=ids, labels=ids).loss
        _set_phase(tracker, "backward")
        loss.backward()
        _set_phase(tracker, "optimizer")
        optimizer.step()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        state = [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
        return StepResult(grads, state, [], [optimizer, loss])
    from transformers import StaticCache

    model.eval()
    _set_phase(tracker, "kv_cache")
    cache = StaticCache(config=unwrapped(model).config, max_cache_len=spec.seq + spec.new_tokens)
    _set_phase(tracker, "forward")
    with torch.no_grad(), autocast:
        position = torch.arange(spec.seq, device=device)
        logits = model(
            input_ids=ids,
            past_key_values=cache,
            cache_position=position,
            use_cache=True,
            logits_to_keep=1,
        ).logits
        for step in range(spec.new_tokens - 1):
            token = logits[:, -1:].argmax(-1)
            position = torch.tensor([spec.seq + step], device=device)
            logits = model(
                input_ids=token, past_key_values=cache, cache_position=position, use_cache=True
            ).logits
    kv = [t for layer in cache.layers for t in (layer.keys, layer.values) if torch.is_tensor(t)]
    return StepResult([], [], kv, [cache, logits])
