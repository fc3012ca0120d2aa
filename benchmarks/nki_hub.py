"""The example Hub kernel repository's fused NKI ViT attention vs the model's own attention
path, on `neuron`: one ViTAttention module forward (projections included), ViT-S/16 shapes
(hidden 384, 6 heads of 64, 197 tokens). Run: python -m benchmarks.nki_hub [--batch N]"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent / "examples" / "nki_hub_kernels"


def _best(fns, repeat):
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for n, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            best[n] = min(best[n], time.perf_counter() - start)
    return best


def main() -> None:
    from kernels import (
        LocalLayerRepository,
        Mode,
        kernelize,
        replace_kernel_forward_from_hub,
        use_kernel_mapping,
    )
    from transformers import ViTConfig
    from transformers.models.vit.modeling_vit import ViTAttention

    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    torch.manual_seed(0)
    replace_kernel_forward_from_hub(ViTAttention, "ViTAttention")
    repo = LocalLayerRepository(repo_path=REPO, layer_name="ViTAttention")
    import torchneuron

    host = torchneuron._C._kernel_isa()
    print(f"CPU: {host['model']}, ISA {host['isa']}; torch threads {torch.get_num_threads()}")
    x = torch.randn(args.batch, 197, 384).to("neuron")
    print(f"ViTAttention forward, batch {args.batch}x197x384 on neuron (best of {args.repeat})")
    for implementation in ("eager", "sdpa"):
        config = ViTConfig(hidden_size=384, num_attention_heads=6, intermediate_size=1536)
        config._attn_implementation = implementation
        default = ViTAttention(config).eval().to("neuron")
        fused = copy.deepcopy(default)
        with use_kernel_mapping({"ViTAttention": {"neuron": repo}}, inherit_mapping=False):
            kernelize(fused, mode=Mode.INFERENCE, device="neuron")
        with torch.no_grad():
            expected, got = default(x)[0], fused(x)[0]  # also traces + compiles the kernel
            torch.testing.assert_close(got.cpu(), expected.cpu(), rtol=1e-4, atol=1e-4)
            t_default, t_fused = _best(
                [lambda m=default: m(x)[0].cpu(), lambda m=fused: m(x)[0].cpu()], args.repeat
            )
        print(
            f"  model's {implementation:5} path {t_default * 1e3:8.2f} ms | fused NKI kernel "
            f"{t_fused * 1e3:8.2f} ms | speedup {t_default / t_fused:.2f}x"
        )


if __name__ == "__main__":
    main()
