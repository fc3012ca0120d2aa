"""The main job: train a small language model from scratch on ``neuron`` to add numbers.

``python -m demo`` (or ``scripts/demo.sh``) needs no network and no flags. It
generates two-digit addition problems, builds a character-level tokenizer and a Llama-style
model from a config (random weights), measures the model's accuracy on held-out problems,
trains it with TRL's ``SFTTrainer`` on the neuron device, measures again, saves the checkpoint,
and reloads it in a separate CPU-only process (``TORCH_DEVICE_BACKEND_AUTOLOAD=0``) that must
produce the same answers token for token. Exit status 0 when it did, and training helped.

``--steps``, ``--model-size``, ``--digits`` scale it; ``--nproc 4`` runs the tensor-parallel x
FSDP recipe under torchrun (see ``demo.distributed``). The pieces live beside this module
in the ``demo`` package.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

# The tokenizer needs no worker threads: leave the host cores to the model.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

from . import evaluation, task, training
from . import model as models
from .arguments import HELD_OUT, parse_args
from .tokenizer import build_tokenizer

MAX_TRAIN_PROBLEMS = 20_000
SHOWN = 4  # example answers printed before and after training


def show_answers(
    out: Callable[[str], None], problems: Sequence[task.Problem], answers: evaluation.Answers
) -> None:
    for problem, text in zip(problems[:SHOWN], answers.completions[:SHOWN], strict=False):
        got = task.Problem.read_answer(text)
        verdict = "right" if text == problem.answer else "wrong"
        out(
            f"    {problem.prompt}{text:<{len(problem.answer)}}  (reads {got} ; "
            f"{problem.a}+{problem.b}={problem.a + problem.b}: {verdict})"
        )


def run(args: argparse.Namespace, out: Callable[[str], None] = print) -> int:
    """The single-process demonstration; returns the exit status."""
    start = time.perf_counter()
    torch.set_num_threads(1)  # tiny matrices: one thread is as fast and never stalls
    if not torch.neuron.is_available():
        out("error: no neuron device is available (check NEURON_RT_VISIBLE_CORES)")
        return 2
    training.quiet_libraries()
    device = torch.device("neuron", torch.neuron.current_device())
    out(f"Device: {device} ({torch.neuron.get_device_name()}), {os.cpu_count()} host cores.")
    out(
        f"Task: add two {args.digits}-digit numbers. Written as characters, e.g. "
        f"{task.Problem(42, 517 % 10**args.digits, args.digits).prompt}...; the answer is written"
    )
    out("  least significant digit first (the order in which carries are computed), so")
    example = task.Problem(47, 38 % 10**args.digits, args.digits)
    total = example.a + example.b
    out(f"  {example.prompt}{example.answer} means {example.a}+{example.b}={total}.")

    split = task.make_problems(args.digits, args.steps * args.batch_size, HELD_OUT, seed=args.seed)
    tokenizer = build_tokenizer()
    model = models.build_model(args.model_size, tokenizer, max_length=64, seed=args.seed)
    out(
        f"Model: Llama-style, '{args.model_size}' "
        f"({models.parameter_count(model) / 1e6:.2f} M parameters), random weights; "
        f"tokenizer: one token per character ({len(tokenizer)} tokens)."
    )
    model.to(device)

    out(f"\nBefore training, on {len(split.held_out)} held-out problems (never trained on):")
    before = evaluation.answer(model, tokenizer, split.held_out)
    show_answers(out, split.held_out, before)
    out(f"  accuracy: {before.accuracy(split.held_out):.1%}")

    out(
        f"\nTraining on neuron with TRL SFTTrainer: {args.steps} steps x {args.batch_size} "
        f"problems, bf16 autocast (TRL's default), loss on the answer only."
    )
    scratch = args.output_dir or tempfile.mkdtemp(prefix="torchneuron-demo-")
    plan = training.TrainingPlan(
        steps=args.steps,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        output_dir=scratch,
        seed=args.seed,
        log_every=max(1, args.steps // 20),
    )
    curve = training.LossCurve()
    trainer = training.make_trainer(model, tokenizer, task.as_records(split.train), plan, curve)
    train_start = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - train_start
    out(
        f"  loss {curve.losses[0]:.3f} (step {curve.steps[0]}) -> {curve.losses[-1]:.3f} "
        f"(step {curve.steps[-1]}) in {train_seconds:.0f} s "
        f"({args.steps * args.batch_size / train_seconds:.0f} problems/s); "
        f"device memory peak {torch.neuron.max_memory_allocated() / 2**20:.0f} MiB"
    )

    out("\nAfter training, the same held-out problems:")
    after = evaluation.answer(training.trained_model(trainer), tokenizer, split.held_out)
    show_answers(out, split.held_out, after)
    out(f"  accuracy: {after.accuracy(split.held_out):.1%}")

    checkpoint = os.path.join(scratch, "checkpoint")
    trainer.save_model(checkpoint)
    tokenizer.save_pretrained(checkpoint)
    out(f"\nSaved the checkpoint (trainer.save_model) to {checkpoint}.")
    out("Reloading it in a separate CPU-only Python process (TORCH_DEVICE_BACKEND_AUTOLOAD=0):")
    reload = evaluation.answer_in_cpu_process(checkpoint, split.held_out)
    same = evaluation.identical_rows(after, reload.answers)
    out(
        f"  model on {reload.model_device}, neuron backend loaded there: {reload.device_registered}"
    )
    out(
        f"  accuracy: {reload.answers.accuracy(split.held_out):.1%}; identical answers to "
        f"neuron's, token for token: {same}/{len(split.held_out)}"
    )
    if args.output_dir is None:
        shutil.rmtree(scratch, ignore_errors=True)

    acc_before, acc_after = before.accuracy(split.held_out), after.accuracy(split.held_out)
    out(
        f"\nResult: accuracy {acc_before:.1%} before -> {acc_after:.1%} after training; "
        f"the CPU reload matches neuron on {same}/{len(split.held_out)} problems; "
        f"total {time.perf_counter() - start:.0f} s."
    )
    ok = same == len(split.held_out) and not reload.device_registered and acc_after > acc_before
    out("OK" if ok else "FAIL: see above")
    return 0 if ok else 1


def launch_distributed(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Re-runs the demo's distributed recipe under torchrun with ``args.nproc`` processes."""
    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or "torchrun"
    forwarded = [a for a in argv if not a.startswith("--nproc")]
    if "--nproc" in argv:  # drop the value that followed a separate "--nproc"
        index = list(argv).index("--nproc")
        forwarded = list(argv[:index]) + list(argv[index + 2 :])
    command = [
        torchrun,
        "--standalone",
        f"--nproc_per_node={args.nproc}",
        "-m",
        "demo.distributed",
        *forwarded,
    ]
    print(f"launching: {' '.join(command)}", flush=True)
    # The demo is not installed: its ranks find it through the checkout it runs from.
    checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join(p for p in (checkout, os.environ.get("PYTHONPATH")) if p)
    return subprocess.call(command, env=dict(os.environ, PYTHONPATH=path))


def main(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.nproc > 1:
        return launch_distributed(args, argv)
    return run(args, out)
