"""The main job's pieces (the demo package) at a very small scale.

The task is checked against its closed form (a + b), the tokenizer by round trip, training
by its loss going down on neuron, and the saved checkpoint by a separate CPU-only process
(TORCH_DEVICE_BACKEND_AUTOLOAD=0) that must answer with exactly neuron's tokens.
"""

from __future__ import annotations

import statistics

import pytest
import torch

from demo import evaluation, task, training
from demo import model as models
from demo.arguments import parse_args
from demo.tokenizer import build_tokenizer


def test_problems_follow_the_closed_form_and_held_out_is_disjoint():
    split = task.make_problems(digits=3, n_train=2000, n_held_out=300, seed=1)
    held = {(p.a, p.b) for p in split.held_out}
    assert len(held) == 300
    assert not held & {(p.a, p.b) for p in split.train}
    for p in split.train[:200] + split.held_out:
        assert len(p.prompt) == 2 * 3 + 2 and len(p.answer) == 3 + 1
        assert task.Problem.read_answer(p.answer) == p.a + p.b
    assert task.Problem(999, 1, 3).answer == "0001"  # 1000, least significant digit first
    assert task.Problem(42, 517, 3).prompt == "042+517="


def test_accuracy_counts_exact_answers():
    problems = task.make_problems(digits=2, n_train=1, n_held_out=40, seed=2).held_out
    right = [p.answer for p in problems]
    # Every fourth answer off by one in the sum (reversed back), and one that is not digits.
    wrong = [
        f"{p.a + p.b + 1:03d}"[::-1] if i % 4 == 0 else p.answer for i, p in enumerate(problems)
    ]
    wrong[1] = "x"
    assert task.accuracy(problems, right) == 1.0
    assert task.accuracy(problems, wrong) == pytest.approx((40 - 10 - 1) / 40, abs=0)
    with pytest.raises(ValueError, match="completions"):
        task.accuracy(problems, right[:-1])
    with pytest.raises(ValueError, match="hold out at most"):
        task.make_problems(digits=1, n_train=1, n_held_out=60, seed=0)


def test_character_tokenizer_round_trip():
    tokenizer = build_tokenizer()
    text = "042+517=9550"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)
    assert tokenizer.decode(ids) == text
    assert len(tokenizer) == 3 + len("0123456789+=")
    with pytest.raises(ValueError, match="repeated"):
        build_tokenizer("00")


def test_train_on_neuron_then_reload_on_cpu(tmp_path):
    torch.manual_seed(0)
    split = task.make_problems(digits=2, n_train=2048, n_held_out=48, seed=0)
    tokenizer = build_tokenizer()
    model = models.build_model("tiny", tokenizer, max_length=32, seed=0).to("neuron")
    training.quiet_libraries()
    plan = training.TrainingPlan(
        steps=24, batch_size=32, learning_rate=3e-3, output_dir=str(tmp_path), log_every=1
    )
    curve = training.LossCurve(show_bar=False)
    trainer = training.make_trainer(model, tokenizer, task.as_records(split.train), plan, curve)
    assert trainer.args.device.type == "neuron"
    trainer.train()
    assert len(curve.losses) == 24
    # Cross-entropy over 15 tokens starts near ln(15) = 2.7; 24 steps learn at least the
    # answer format and the digit frequencies (measured: ~2.6 -> ~1.3).
    assert statistics.mean(curve.losses[-4:]) < statistics.mean(curve.losses[:4]) - 0.5

    ids = tokenizer([p.prompt for p in split.held_out], return_tensors="pt")["input_ids"]
    ids = ids.to("neuron")
    with torch.no_grad():
        wrapped_logits = trainer.model(ids).logits.cpu()
    trained = training.trained_model(trainer)
    assert trained.device.type == "neuron"
    on_neuron = evaluation.answer(trained, tokenizer, split.held_out)
    # Accuracy against the closed form a + b, read back from the (reversed) answer text.
    expected = sum(
        len(t) == 3 and task.Problem.read_answer(t) == p.a + p.b
        for t, p in zip(on_neuron.completions, split.held_out, strict=True)
    )
    assert on_neuron.accuracy(split.held_out) == expected / 48

    checkpoint = tmp_path / "checkpoint"
    trainer.save_model(str(checkpoint))
    reload = evaluation.answer_in_cpu_process(checkpoint, split.held_out)
    assert not reload.device_registered
    # Regression: trainer.model kept Accelerate's bf16 autocast wrapper (SFTConfig's bf16=True
    # default), so its logits were not the saved float32 model's; trained_model unwraps it.
    assert not torch.equal(wrapped_logits, trained(ids).logits.cpu())
    assert reload.model_device == "cpu"
    assert reload.answers.tokens == on_neuron.tokens  # greedy, float32: token for token
    assert evaluation.identical_rows(reload.answers, on_neuron) == 48


def test_demo_rejects_bad_options(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--steps", "0"])
    assert "must be positive" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--model-size", "huge"])
