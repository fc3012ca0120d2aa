"""Reload a saved checkpoint in a plain CPU process and answer the held-out prompts greedily.

Run as a script by path (``python -P cpu_reload.py CHECKPOINT REQUEST RESULT``) with
``TORCH_DEVICE_BACKEND_AUTOLOAD=0``: it imports torch and transformers only, never torchneuron,
so no device exists in this process; it says so in its result. REQUEST is JSON
``{"prompts": [...], "max_new_tokens": N}``; RESULT receives ``{"tokens": [[...], ...],
"completions": [...], "device_registered": bool}``. ``greedy_completions`` is also what the demo
runs on neuron, so both sides generate the same way.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

import torch


def greedy_completions(
    model: Any, tokenizer: Any, prompts: Sequence[str], max_new_tokens: int
) -> tuple[list[list[int]], list[str]]:
    """Greedy generation for equal-length ``prompts`` on the model's device.

    Returns the new tokens of each prompt up to (not including) the first end-of-sequence
    token, and their decoded text.
    """
    inputs = tokenizer(list(prompts), return_tensors="pt", add_special_tokens=False)
    if "attention_mask" in inputs and not bool(inputs["attention_mask"].all()):
        raise ValueError("greedy_completions expects prompts of equal length (no padding)")
    inputs = {name: tensor.to(model.device) for name, tensor in inputs.items()}
    # no_grad, not inference_mode: an FSDP2 model keeps the all-gather buffers it makes here,
    # and inference tensors could not be updated in place by the training that follows.
    with torch.no_grad():
        output = model.generate(
            **inputs, max_new_tokens=max_new_tokens, do_sample=False, disable_compile=True
        )
    new_tokens = output[:, inputs["input_ids"].shape[1] :].cpu().tolist()
    tokens = []
    for row in new_tokens:
        end = row.index(tokenizer.eos_token_id) if tokenizer.eos_token_id in row else len(row)
        tokens.append(row[:end])
    return tokens, [tokenizer.decode(row) for row in tokens]


def main(argv: Sequence[str]) -> int:
    """Loads CHECKPOINT on the CPU, answers REQUEST's prompts, writes RESULT."""
    if len(argv) != 3:
        print("usage: cpu_reload.py CHECKPOINT REQUEST.json RESULT.json", file=sys.stderr)
        return 2
    checkpoint, request_path, result_path = argv
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    with open(request_path) as f:
        request = json.load(f)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    tokens, completions = greedy_completions(
        model, tokenizer, request["prompts"], request["max_new_tokens"]
    )
    result = {
        "tokens": tokens,
        "completions": completions,
        "model_device": str(model.device),
        # The proof that this process ran without the device: the backend was never loaded.
        "device_registered": "torchneuron" in sys.modules
        or torch._C._get_privateuse1_backend_name() != "privateuseone",
    }
    with open(result_path, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
