"""The command-line arguments that describe one step and its layout, shared by
``python -m torchneuron.fidelity.fit`` and ``python -m torchneuron.fidelity.projection``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from .layout import Layout
from .model_source import PRESETS
from .step import StepSpec


def add_step_arguments(
    p: argparse.ArgumentParser,
    dtypes: Sequence[str] = ("fp32", "bf16", "fp16"),
    optimizer: bool = True,
) -> None:
    """The model, the step (StepSpec's fields) and the layout (tp, fsdp, dp) and --chip."""
    p.add_argument("model", help=f"preset ({', '.join(PRESETS)}), config.json or checkpoint dir")
    p.add_argument("--batch", type=int, default=1, help="micro-batch per data-parallel replica")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--inference", action="store_true", help="prefill + decode with a KV cache")
    p.add_argument("--new-tokens", type=int, default=1)
    p.add_argument("--dtype", choices=tuple(dtypes), default="bf16")
    p.add_argument("--autocast", action="store_true", help="bf16 autocast around the forward")
    if optimizer:
        p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    p.add_argument("--grad-checkpointing", action="store_true")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--fsdp", type=int, default=1)
    p.add_argument("--dp", type=int, default=1)
    p.add_argument("--chip", action="append", help="trn1, trn2, trn2:1, trn3 ... (repeatable)")


def step_spec(a: argparse.Namespace) -> StepSpec:
    """The StepSpec of parsed arguments (StepSpec's default optimizer where there is no
    --optimizer); raises ValueError for values StepSpec refuses."""
    chosen = {"optimizer": a.optimizer} if "optimizer" in vars(a) else {}
    return StepSpec(
        batch=a.batch,
        seq=a.seq,
        training=not a.inference,
        dtype=a.dtype,
        autocast=a.autocast,
        grad_checkpointing=a.grad_checkpointing,
        new_tokens=a.new_tokens,
        **chosen,
    )


def layout(a: argparse.Namespace) -> Layout:
    return Layout(a.tp, a.fsdp, a.dp)
