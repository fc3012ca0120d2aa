"""Shared pieces of the fine-tuning tests: a character tokenizer built locally, a tiny
Llama-style model from a config, a small arithmetic data set, and helpers that run the
same training on the CPU and on neuron and return the per-step losses.

Nothing comes from the Hugging Face Hub: the tokenizer is a `tokenizers` BPE model with no
merges over a fixed character set (so it tokenizes character by character), wrapped in
`PreTrainedTokenizerFast`.
"""

from __future__ import annotations

import copy
import os
import random
import string
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

# Losses of a run on neuron against the same run on the CPU.
# float32: the device's native kernels (GEMM, softmax, SiLU) round differently from the CPU's
# (the order of their sums depends on the host's instruction set), by a few units of 2**-24
# per op; a loss over a few steps moves far less than 1e-5 relative (80 units).
FP32_TOL = {"rtol": 1e-5, "atol": 1e-6}
# bf16 autocast: matmuls round their outputs to bf16 (8 bits of mantissa, relative step
# 2**-8 = 3.9e-3). The kernels differ only in where a float32 rounding lands before that bf16
# rounding; a loss near 3-4 moves by a few ulps of bf16 over a few steps. 1e-2 relative is about
# three bf16 ulps.
BF16_TOL = {"rtol": 1e-2, "atol": 1e-3}

SPECIAL = ["<pad>", "<s>", "</s>", "<unk>"]
CHARS = string.digits + string.ascii_letters + " +-*=?.,:;!'\n"
TESTS_DIR = Path(__file__).resolve().parent.parent  # tests/


def make_tokenizer() -> Any:
    """A character-level fast tokenizer with pad, bos, eos and unk tokens."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + list(CHARS))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=128,
    )


def tiny_config(tokenizer: Any, **overrides: Any) -> Any:
    """A 2-layer Llama with hidden size 32 (4 heads, 2 key/value heads: divisible by tp=2)."""
    from transformers import LlamaConfig

    args = dict(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    args.update(overrides)
    return LlamaConfig(**args)


def tiny_model(tokenizer: Any, seed: int = 0, **overrides: Any) -> Any:
    """A freshly initialised tiny Llama on the CPU, in float32, with a fixed seed."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_config(tokenizer, **overrides)).float()


# The tokenizer and the tiny model as module-scoped fixtures, for the test modules that
# import them (`from support.finetune_fixtures import base_model_fixture, tokenizer_fixture`);
# tests ask for them by their names, `tok` and `base`.
@pytest.fixture(scope="module", name="tok")
def tokenizer_fixture() -> Any:
    return make_tokenizer()


@pytest.fixture(scope="module", name="base")
def base_model_fixture(tok: Any) -> torch.nn.Module:
    return tiny_model(tok)


def arithmetic_texts(n: int, seed: int = 0) -> list[str]:
    """Short sums with their answers ("12+7=19"), of varying lengths."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(0, 10 ** rng.randint(1, 3)), rng.randint(0, 999)
        out.append(f"{a}+{b}={a + b}")
    return out


def text_dataset(n: int = 32, seed: int = 0) -> Any:
    """A `datasets.Dataset` with one "text" column."""
    from datasets import Dataset

    return Dataset.from_dict({"text": arithmetic_texts(n, seed)})


def tokenized_dataset(tokenizer: Any, n: int = 32, seed: int = 0) -> Any:
    """The text data set tokenized for causal LM (labels added by the collator)."""
    ds = text_dataset(n, seed)
    return ds.map(
        lambda row: tokenizer(row["text"] + tokenizer.eos_token),
        remove_columns=["text"],
    )


def step_losses(log_history: Sequence[dict[str, Any]]) -> list[float]:
    """The training loss of each logged step (logging_steps=1)."""
    return [entry["loss"] for entry in log_history if "loss" in entry and "eval_loss" not in entry]


def eval_losses(log_history: Sequence[dict[str, Any]]) -> list[float]:
    return [entry["eval_loss"] for entry in log_history if "eval_loss" in entry]


def clone(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy on the CPU, so the CPU and neuron runs start from the same weights."""
    return copy.deepcopy(model).cpu()


def assert_losses_close(got: Sequence[float], expected: Sequence[float], tol: dict) -> float:
    """Asserts elementwise closeness; returns the largest relative difference seen."""
    assert len(got) == len(expected) > 0, (got, expected)
    torch.testing.assert_close(
        torch.tensor(got, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64), **tol
    )
    worst = max(abs(g - e) / max(abs(e), 1e-12) for g, e in zip(got, expected, strict=True))
    print(f"losses: largest relative difference {worst:.2e} over {len(got)} steps")  # pytest -rP
    return worst


def reset_accelerate_state() -> None:
    """Forgets Accelerate's process-wide state, so the next Accelerator or Trainer in this
    process starts from its own arguments (mixed precision, cpu)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def plain_cpu_env() -> dict[str, str]:
    """The environment of a process that must not load torchneuron (a CPU-only machine)."""
    env = dict(os.environ)
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    return env


def run_interpreter(
    args: Sequence[str], *, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python args...` with this interpreter; fails the caller with stderr on error."""
    done = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env if env is not None else dict(os.environ),
        cwd=str(TESTS_DIR),
    )
    assert done.returncode == 0, (
        f"{args}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-6000:]}"
    )
    return done
