"""Training: TRL's ``SFTTrainer`` on prompt-completion records, with a progress bar and the loss.

The trainer computes the loss on the completion only (the answer and the end-of-sequence token),
so the loss measures how well the model answers, not how well it guesses random prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast
    from trl import SFTTrainer

from transformers import TrainerCallback


@dataclass(frozen=True)
class TrainingPlan:
    """What to train for and how fast."""

    steps: int
    batch_size: int
    learning_rate: float
    output_dir: str
    seed: int = 0
    log_every: int = 10
    use_cpu: bool = False


@dataclass
class LossCurve(TrainerCallback):
    """Records the training loss at every logging step and draws a progress bar with it."""

    show_bar: bool = True
    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    _bar: Any = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.show_bar and state.is_world_process_zero:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=state.max_steps, desc="training", unit="step", leave=True)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._bar is not None:
            self._bar.update(state.global_step - self._bar.n)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kw: Any
    ) -> None:
        if logs and "loss" in logs:
            self.steps.append(state.global_step)
            self.losses.append(float(logs["loss"]))
            if self._bar is not None:
                self._bar.set_postfix(loss=f"{logs['loss']:.3f}")

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def quiet_libraries() -> None:
    """Hide the libraries' per-dataset progress bars and advisory warnings: the demo's own
    lines say what happens."""
    import warnings

    import datasets
    import transformers

    # TRL 1.16's SFTConfig still sets the renamed `gradient_checkpointing` field itself.
    warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*deprecated")
    datasets.disable_progress_bars()
    datasets.utils.logging.set_verbosity_error()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def sft_config(plan: TrainingPlan, **overrides: Any) -> Any:
    """The ``SFTConfig`` of a plan: cosine schedule with short warm-up, no saving mid-run,
    no reporting integrations, logging every ``plan.log_every`` steps."""
    from trl import SFTConfig

    options: dict[str, Any] = {
        "output_dir": plan.output_dir,
        "max_steps": plan.steps,
        "per_device_train_batch_size": plan.batch_size,
        "learning_rate": plan.learning_rate,
        "lr_scheduler_type": "cosine",
        "warmup_steps": max(1, plan.steps // 20),
        "weight_decay": 0.0,
        "logging_steps": plan.log_every,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,  # LossCurve draws the bar
        "dataloader_num_workers": 0,
        "seed": plan.seed,
        "use_cpu": plan.use_cpu,
        # Every example has the same length: no padding needed (TRL's "auto" would pad each
        # batch to 128 tokens on neuron, which bounds compilations but is pure waste eagerly).
        "pad_to_multiple_of": None,
    }
    options.update(overrides)
    return SFTConfig(**options)


def make_trainer(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    records: Sequence[dict[str, str]],
    plan: TrainingPlan,
    curve: LossCurve,
    **config_overrides: Any,
) -> SFTTrainer:
    """An ``SFTTrainer`` over prompt-completion ``records``, reporting to ``curve``."""
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback
    from trl import SFTTrainer

    trainer = SFTTrainer(
        model=model,
        args=sft_config(plan, **config_overrides),
        train_dataset=Dataset.from_list(list(records)),
        processing_class=tokenizer,
        callbacks=[curve],
    )
    trainer.remove_callback(PrinterCallback)  # it prints every log dict; the bar shows the loss
    return trainer


def trained_model(trainer: SFTTrainer) -> PreTrainedModel:
    """The trained model without Accelerate's mixed-precision wrapper.

    ``SFTConfig`` defaults to ``bf16=True``, and Accelerate then wraps ``model.forward`` in
    bf16 autocast for good, so generating with ``trainer.model`` after training would run in
    bf16 while a reloaded checkpoint runs in float32 (measured: logits differ by ~0.06 and
    1-4 of 200 greedy answers flip). Unwrapped, the device runs the float32 model that was
    saved, and its answers can be compared with the CPU reload token for token.
    """
    return trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False)
