"""The task: adding two fixed-width numbers, written as characters ("042+517=0559").

Every problem has the same length (operands zero-padded to ``digits`` characters, the sum to
``digits + 1``), so batches need no padding and the model's answer is checked exactly. The
answer is written with its least significant digit first ("042+517=9550"): that is the order
in which carries are computed by hand, so a left-to-right model can learn the carry from digits
it has already written; tiny models learn it several times faster this way.
Train and held-out problems are disjoint (held-out pairs are drawn first and excluded).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One addition problem ``a + b``."""

    a: int
    b: int
    digits: int

    @property
    def prompt(self) -> str:
        """What the model is given, e.g. ``"042+517="``."""
        return f"{self.a:0{self.digits}d}+{self.b:0{self.digits}d}="

    @property
    def answer(self) -> str:
        """What it must write: the sum, ``digits + 1`` wide, least significant digit first."""
        return f"{self.a + self.b:0{self.digits + 1}d}"[::-1]

    @staticmethod
    def read_answer(text: str) -> int | None:
        """The number an answer string denotes (reversed digits), None if it is not digits."""
        return int(text[::-1]) if text.isdigit() else None


@dataclass(frozen=True)
class Split:
    """Disjoint training and held-out problems."""

    train: list[Problem]
    held_out: list[Problem]


def make_problems(digits: int, n_train: int, n_held_out: int, seed: int) -> Split:
    """Draws ``n_held_out`` distinct problems, then ``n_train`` problems not among them.

    Training problems are drawn with replacement (a small space repeats), held-out ones without.
    """
    if digits < 1:
        raise ValueError(f"digits must be at least 1, got {digits}")
    space = 10 ** (2 * digits)
    if n_held_out > space // 2:
        raise ValueError(
            f"{n_held_out} held-out problems leave too few of the {space} distinct "
            f"{digits}-digit additions to train on (hold out at most {space // 2})"
        )
    rng = random.Random(seed)
    limit = 10**digits
    held_pairs: set[tuple[int, int]] = set()
    while len(held_pairs) < n_held_out:
        held_pairs.add((rng.randrange(limit), rng.randrange(limit)))
    train: list[Problem] = []
    while len(train) < n_train:
        pair = (rng.randrange(limit), rng.randrange(limit))
        if pair not in held_pairs:
            train.append(Problem(*pair, digits))
    held_out = [Problem(a, b, digits) for a, b in sorted(held_pairs)]
    rng.shuffle(held_out)
    return Split(train, held_out)


def accuracy(problems: Sequence[Problem], completions: Sequence[str]) -> float:
    """Fraction of problems whose completion is exactly the right answer."""
    if len(problems) != len(completions):
        raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
    if not problems:
        raise ValueError("no problems to score")
    right = sum(p.answer == c for p, c in zip(problems, completions, strict=True))
    return right / len(problems)


def as_records(problems: Sequence[Problem]) -> list[dict[str, str]]:
    """Prompt-completion records, the dataset format ``SFTTrainer`` trains on the completion of."""
    return [{"prompt": p.prompt, "completion": p.answer} for p in problems]
