"""Evaluation: the model's greedy answers to held-out problems, on the device or on a CPU reload."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import cpu_reload
from .task import Problem, accuracy


@dataclass(frozen=True)
class Answers:
    """What a model answered: token ids (up to end-of-sequence) and text, per problem."""

    tokens: list[list[int]]
    completions: list[str]

    def accuracy(self, problems: Sequence[Problem]) -> float:
        return accuracy(problems, self.completions)


def answer_length(problems: Sequence[Problem]) -> int:
    """New tokens to generate: the longest answer plus the end-of-sequence token."""
    return max(len(p.answer) for p in problems) + 1


def answer(model: Any, tokenizer: Any, problems: Sequence[Problem]) -> Answers:
    """Greedy answers of ``model`` (in eval mode, on its own device) to ``problems``."""
    was_training = model.training
    model.eval()
    try:
        tokens, texts = cpu_reload.greedy_completions(
            model, tokenizer, [p.prompt for p in problems], answer_length(problems)
        )
    finally:
        model.train(was_training)
    return Answers(tokens, texts)


@dataclass(frozen=True)
class CpuReload:
    """The answers of a checkpoint reloaded in a separate CPU-only process."""

    answers: Answers
    device_registered: bool
    model_device: str


def answer_in_cpu_process(checkpoint: str | Path, problems: Sequence[Problem]) -> CpuReload:
    """Runs ``cpu_reload.py`` in a fresh interpreter with the device backend's autoload off."""
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0", TOKENIZERS_PARALLELISM="false")
    with tempfile.TemporaryDirectory(prefix="cpu_reload-") as scratch:
        request = Path(scratch, "request.json")
        result = Path(scratch, "result.json")
        request.write_text(
            json.dumps(
                {"prompts": [p.prompt for p in problems], "max_new_tokens": answer_length(problems)}
            )
        )
        # -P: the script's folder (this package) is not put on sys.path, so nothing here is
        # importable there by accident; the script imports torch and transformers only.
        command = [sys.executable, "-P", cpu_reload.__file__, str(checkpoint), str(request)]
        completed = subprocess.run(
            [*command, str(result)], env=env, capture_output=True, text=True, check=False
        )
        if completed.returncode != 0:
            raise RuntimeError(
                f"the CPU reload process failed (exit {completed.returncode}):\n"
                f"{completed.stderr[-4000:]}"
            )
        data = json.loads(result.read_text())
    return CpuReload(
        Answers(data["tokens"], data["completions"]),
        bool(data["device_registered"]),
        str(data["model_device"]),
    )


def identical_rows(a: Answers, b: Answers) -> int:
    """How many problems got exactly the same tokens from both."""
    if len(a.tokens) != len(b.tokens):
        raise ValueError(f"{len(a.tokens)} answers against {len(b.tokens)}")
    return sum(x == y for x, y in zip(a.tokens, b.tokens, strict=True))
