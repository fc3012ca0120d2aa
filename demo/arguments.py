"""The demo's command line, shared by the single-process run and the torchrun recipe."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from .model import MODEL_SIZES

HELD_OUT = 200


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m demo",
        description="Train a small causal LM from scratch on neuron to add numbers; check the "
        "saved checkpoint on the CPU.",
    )
    parser.add_argument("--steps", type=int, default=450, help="training steps (default 450)")
    parser.add_argument(
        "--model-size", choices=sorted(MODEL_SIZES), default="tiny", help="default tiny"
    )
    parser.add_argument("--digits", type=int, default=2, help="digits per operand (default 2)")
    parser.add_argument("--batch-size", type=int, default=128, help="per step (default 128)")
    parser.add_argument("--learning-rate", type=float, default=3e-3, help="peak (default 3e-3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="processes; 4 runs tensor parallel x FSDP (2 x 2) under torchrun",
    )
    parser.add_argument(
        "--output-dir", default=None, help="keep the checkpoint here (default: a temporary dir)"
    )
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1 or args.nproc < 1:
        parser.error("--steps, --batch-size and --nproc must be positive")
    return args
