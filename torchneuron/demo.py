"""The main job: generate with a small Llama-style model on ``neuron`` and check it against CPU.

Run it with ``python -m torchneuron.demo`` (or ``scripts/demo.sh``). It needs no network and no
flags: the model is built from a ``transformers.LlamaConfig`` with seeded random weights, and
the tokenizer is a byte-level BPE trained in a few milliseconds on a paragraph embedded below.
One copy of the model runs on the CPU, an identical copy on the ``neuron`` device; both run
greedy ``generate`` with a static KV cache on a batch of two prompts. The tokens must be
identical (the process exits with status 1 if they are not).

Random weights generate gibberish; the point is that the device produces exactly what
PyTorch's CPU backend produces, through the unmodified Hugging Face generation loop. The
prefill logits agree to about 1e-5 rather than bit for bit: on neuron,
``scaled_dot_product_attention`` currently takes PyTorch's math path (bmm, softmax, bmm)
where CPU takes its fused flash-attention kernel.
"""

from __future__ import annotations

import copy
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

# The tokenizer needs no worker threads: leave the host cores to the model.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SEED = 0
MAX_NEW_TOKENS = 24
PROMPTS: tuple[str, ...] = (
    "The software NeuronCore runs every operator",
    "Trainium chips group physical cores into logical cores, so",
)
# The tokenizer's training text: any English paragraph works; this one describes the demo.
CORPUS: tuple[str, ...] = (
    "The neuron device is a PyTorch backend. Tensors live in device memory, and every "
    "operator runs on a software NeuronCore that executes on the host CPU.",
    "Trainium chips group physical cores into logical cores; each logical core is a device "
    "with its own high bandwidth memory, streams and events.",
    "A small Llama model is built from a configuration with random weights. It generates "
    "tokens greedily with a static key value cache, first on the CPU and then on the device, "
    "so that the two runs can be compared token by token.",
    "The caching allocator keeps blocks of device memory for reuse, and the runtime counts "
    "every operator that ran and every operator that fell back to the host.",
)
# Model shape: a scaled-down Llama 3 (grouped-query attention, SwiGLU, RMSNorm, RoPE).
HIDDEN_SIZE = 256
NUM_LAYERS = 4
NUM_HEADS = 8
NUM_KV_HEADS = 4
INTERMEDIATE_SIZE = 512
TOKENIZER_VOCAB = 1000
# The model's matrices are tiny (a few hundred wide): one intra-op thread runs them as fast
# as two, and cannot stall in OpenMP waiting for a descheduled worker on a busy small host
# (measured: ~0.2 s per generate with 1 thread, 0.7–13 s with 2 on a loaded 2-core VM).
INTRA_OP_THREADS = 1


def progress(message: str) -> None:
    """Prints one progress line, flushed at once."""
    print(f"[demo] {message}", flush=True)


def build_tokenizer(vocab_size: int = TOKENIZER_VOCAB) -> PreTrainedTokenizerFast:
    """Trains a byte-level BPE tokenizer on CORPUS and wraps it for transformers.

    Returns a ``PreTrainedTokenizerFast`` with left padding (what batched generation wants).
    The vocabulary may be smaller than ``vocab_size`` when the corpus runs out of merges.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(CORPUS, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        padding_side="left",
    )


def build_model(vocab_size: int, pad_token_id: int, bos_token_id: int) -> torch.nn.Module:
    """A seeded, randomly initialised LlamaForCausalLM in float32 and eval mode, on the CPU."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN_SIZE,
        intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        max_position_embeddings=256,
        pad_token_id=pad_token_id,
        bos_token_id=bos_token_id,
        eos_token_id=None,  # random weights: never stop early, always MAX_NEW_TOKENS
        tie_word_embeddings=False,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    # An untrained model at the default init (std 0.02) has nearly flat logits; a wider init
    # makes greedy decoding decisive, so the comparison is about the device and not about ties.
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.1)
    model.generation_config.pad_token_id = pad_token_id
    model.generation_config.eos_token_id = None
    return model


TIMED_ROUNDS = 3  # timed generate calls per device, interleaved; the fastest counts


@dataclass
class GenerationRun:
    """What one device produced: the new tokens, prefill logits and timing."""

    device: str
    inputs: dict[str, torch.Tensor]  # the prompt batch, on `device`
    tokens: torch.Tensor  # (batch, MAX_NEW_TOKENS), on the CPU
    prefill_logits: torch.Tensor  # (batch, prompt_len, vocab), float32, on the CPU
    seconds: list[float] = field(default_factory=list)  # one entry per timed generate

    @property
    def tokens_per_second(self) -> float:
        """Throughput of the fastest timed run (the least disturbed on a shared host)."""
        return self.tokens.numel() / min(self.seconds)


def synchronize(device: str) -> None:
    """Waits for the device's queued work (a no-op on the CPU)."""
    if device.startswith("neuron"):
        torch.neuron.synchronize()


def generate(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Greedy generation of exactly MAX_NEW_TOKENS tokens with a static KV cache."""
    with torch.inference_mode():
        return model.generate(
            **inputs,
            max_new_tokens=MAX_NEW_TOKENS,
            min_new_tokens=MAX_NEW_TOKENS,
            do_sample=False,
            cache_implementation="static",
            # On a neuron device with a static cache, transformers would torch.compile the
            # decode step with backend="neuron". This demo checks eager execution against
            # CPU eager (which transformers never auto-compiles), so both runs stay eager.
            disable_compile=True,
        )


def first_run(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor], device: str
) -> GenerationRun:
    """Prefill logits and one (untimed, warm-up) generation on ``device``."""
    on_device = {name: tensor.to(device) for name, tensor in inputs.items()}
    prompt_len = on_device["input_ids"].shape[1]
    with torch.inference_mode():
        prefill_logits = model(**on_device).logits.float().cpu()
    output = generate(model, on_device)
    return GenerationRun(device, on_device, output[:, prompt_len:].cpu(), prefill_logits)


def timed_generate(model: torch.nn.Module, run: GenerationRun) -> None:
    """Times one more generation on ``run.device`` and checks it repeats the first one."""
    synchronize(run.device)
    start = time.perf_counter()
    output = generate(model, run.inputs)
    synchronize(run.device)
    run.seconds.append(time.perf_counter() - start)
    prompt_len = run.inputs["input_ids"].shape[1]
    if not torch.equal(output[:, prompt_len:].cpu(), run.tokens):
        raise RuntimeError(f"{run.device}: generation is not deterministic across calls")


def format_ops(ops: dict[str, int], top: int) -> list[str]:
    """The ``top`` most executed ops as ``name  count`` lines."""
    ranked = sorted(ops.items(), key=lambda item: (-item[1], item[0]))[:top]
    width = max((len(name) for name, _ in ranked), default=0)
    return [f"    {name:<{width}}  {count:>7}" for name, count in ranked]


def describe_device() -> list[str]:
    """Lines describing the current neuron device and its properties."""
    props = torch.neuron.get_device_properties()
    lines = [
        f"device: {torch.device('neuron', torch.neuron.current_device())} "
        f"({torch.neuron.device_count()} visible, "
        f"accelerator={torch.accelerator.current_accelerator()})",
        f"  name: {props.name}",
        f"  total_memory: {props.total_memory / 2**30:.2f} GiB",
    ]
    for name in (
        "chip",
        "logical_nc_config",
        "hbm_bytes",
        "hbm_bandwidth_bytes_per_s",
        "peak_bf16_flops",
        "peak_fp32_flops",
    ):
        value = getattr(props, name, None)
        if value is None:
            continue
        if name == "hbm_bytes":
            value = f"{value / 2**30:.0f} GiB"
        elif name == "hbm_bandwidth_bytes_per_s":
            value = f"{value / 1e9:.0f} GB/s"
        elif name.startswith("peak_"):
            value = f"{value / 1e12:.2f} TFLOP/s"
        lines.append(f"  {name}: {value}")
    return lines


def main(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> int:
    """Runs the demonstration; returns 0 when CPU and neuron agree token for token."""
    del argv  # no flags: everything is embedded
    total_start = time.perf_counter()
    torch.set_num_threads(INTRA_OP_THREADS)
    if not torch.neuron.is_available():
        out("error: no neuron device is available (check NEURON_RT_VISIBLE_CORES)")
        return 2

    for line in describe_device():
        out(line)

    progress(f"host: {os.cpu_count()} cores, {torch.get_num_threads()} intra-op thread(s)")
    progress("training a byte-level BPE tokenizer on the embedded corpus")
    tokenizer = build_tokenizer()
    vocab_size = len(tokenizer)
    progress(f"tokenizer ready: {vocab_size} tokens")

    progress(
        f"building LlamaForCausalLM from a config (hidden {HIDDEN_SIZE}, {NUM_LAYERS} layers, "
        f"{NUM_HEADS} heads, {NUM_KV_HEADS} KV heads, intermediate {INTERMEDIATE_SIZE}, "
        f"vocab {vocab_size}, seed {SEED})"
    )
    cpu_model = build_model(vocab_size, tokenizer.pad_token_id, tokenizer.bos_token_id)
    n_params = sum(p.numel() for p in cpu_model.parameters())
    progress(f"model ready: {n_params / 1e6:.2f} M parameters")

    inputs = tokenizer(list(PROMPTS), return_tensors="pt", padding=True)
    inputs = {"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]}
    progress(f"batch of {len(PROMPTS)} prompts, padded to {inputs['input_ids'].shape[1]} tokens")

    progress(f"CPU: prefill + greedy generate, {MAX_NEW_TOKENS} new tokens, static cache")
    cpu_run = first_run(cpu_model, inputs, "cpu")

    progress("copying the model to neuron (.to('neuron'))")
    torch.neuron.reset_peak_memory_stats()
    neuron_model = copy.deepcopy(cpu_model).to("neuron")
    weights_bytes = torch.neuron.memory_allocated()
    torch.neuron.clear_op_tracking()
    progress(f"neuron: prefill + greedy generate, {MAX_NEW_TOKENS} new tokens, static cache")
    neuron_run = first_run(neuron_model, inputs, "neuron")
    executed = torch.neuron.get_executed_ops()
    fallbacks = torch.neuron.get_fallback_ops()

    progress(f"timing: {TIMED_ROUNDS} rounds of generate, alternating CPU and neuron")
    for _ in range(TIMED_ROUNDS):
        timed_generate(cpu_model, cpu_run)
        timed_generate(neuron_model, neuron_run)

    out("")
    for i, prompt in enumerate(PROMPTS):
        out(f"prompt {i}: {prompt!r}")
        for run in (cpu_run, neuron_run):
            ids = run.tokens[i].tolist()
            out(f"  {run.device:>6} tokens: {ids}")
        out(f"  text: {tokenizer.decode(neuron_run.tokens[i], skip_special_tokens=True)!r}")

    identical = torch.equal(cpu_run.tokens, neuron_run.tokens)
    logits_diff = (cpu_run.prefill_logits - neuron_run.prefill_logits).abs().max().item()
    out("")
    out(f"tokens identical: {identical}")
    out(f"prefill logits max |cpu - neuron|: {logits_diff:.3g}")
    for run in (cpu_run, neuron_run):
        out(
            f"{run.device:>6}: {run.tokens.numel()} tokens in {min(run.seconds):.3f} s = "
            f"{run.tokens_per_second:.1f} tokens/s (best of "
            f"{', '.join(f'{t:.3f}' for t in run.seconds)} s)"
        )
    ratio = neuron_run.tokens_per_second / cpu_run.tokens_per_second
    out(f"neuron/cpu generation throughput: {ratio:.2f}x")
    mib = 2**20
    out(
        f"neuron memory: weights {weights_bytes / mib:.1f} MiB, allocated now "
        f"{torch.neuron.memory_allocated() / mib:.1f} MiB, peak "
        f"{torch.neuron.max_memory_allocated() / mib:.1f} MiB, reserved "
        f"{torch.neuron.memory_reserved() / mib:.1f} MiB"
    )
    out(
        f"ops executed on neuron (one prefill + one generate): {sum(executed.values())} calls "
        f"of {len(executed)} distinct ops; top 10:"
    )
    for line in format_ops(executed, 10):
        out(line)
    if fallbacks:
        out(f"fallback ops (host round trip): {sum(fallbacks.values())} calls")
        for line in format_ops(fallbacks, 10):
            out(line)
    else:
        out("fallback ops (host round trip): none")
    out(f"total time: {time.perf_counter() - total_start:.1f} s")

    if not identical:
        mismatch = (cpu_run.tokens != neuron_run.tokens).nonzero().tolist()
        out(f"FAIL: neuron tokens differ from CPU at (row, step) {mismatch[:8]}")
        return 1
    out("OK: neuron generated exactly the CPU's tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
