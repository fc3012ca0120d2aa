"""Where the time goes in a small Llama's training step and decode step (torch.profiler).

Prints the ops with the most self time per step: a training step of benchmarks/training.py's
model (20M parameters, batch 4 x 128, fused AdamW) in float32 and under bf16 autocast, and
one decode step of benchmarks/hf_generate.py's 100M model against a 64-token cache in
float32 and bfloat16. It chose the order of the native row kernels (benchmarks/RESULTS.md).

    python benchmarks/row_profile.py            # on the CPU (neuron runs the same kernels)
    python benchmarks/row_profile.py neuron     # on the device
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import torch


def profile(fn: Callable[[], object], label: str, steps: int = 3) -> None:
    fn()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            fn()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    print(f"== {label}: {total / steps / 1e3:.2f} ms self time per step")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:16]:
        share = 100 * e.self_cpu_time_total / total
        print(
            f"   {e.key:<45} {e.self_cpu_time_total / steps / 1e3:8.3f} ms {share:5.1f}%"
            f"  calls {e.count // steps}"
        )


def main() -> int:
    from transformers import LlamaConfig, LlamaForCausalLM

    device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    if device == "neuron":
        import torchneuron  # noqa: F401
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=8000,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    for bf16 in (False, True):
        model = LlamaForCausalLM(config).to(device).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        ids = torch.randint(1, 8000, (4, 128)).to(device)

        def step(model=model, optimizer=optimizer, ids=ids, bf16=bf16) -> None:
            with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        profile(step, f"train {device} {'bf16 autocast' if bf16 else 'float32'}")
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=8,
        num_attention_heads=12,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    for dtype in (torch.float32, torch.bfloat16):
        model = LlamaForCausalLM(config).to(device, dtype).eval()
        ids = torch.randint(1, 32000, (1, 64)).to(device)
        with torch.no_grad():
            out = model(input_ids=ids, use_cache=True)
            cache, token = out.past_key_values, out.logits[:, -1:].argmax(-1)

            def decode(model=model, cache=cache, token=token) -> None:
                model(input_ids=token, past_key_values=cache, use_cache=True)
                cache.crop(-1)  # back to 64 cached tokens

            profile(decode, f"decode {device} {dtype}", steps=5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
