"""The example NKI kernel repository (examples/nki_hub_kernels) loaded by the `kernels`
library (LocalLayerRepository / get_local_kernel + kernelize) into Transformers models on
`neuron`: outputs equal the models' own to float32 rounding."""

from __future__ import annotations

from pathlib import Path

import kernels  # pinned in requirements.txt (0.17.2), as is transformers
import torch

REPO = Path(__file__).resolve().parent.parent / "examples" / "nki_hub_kernels"


def test_get_local_kernel_resolves_the_torch_neuron_variant():
    module = kernels.get_local_kernel(REPO)
    assert {"RMSNorm", "ViTAttention"} <= set(dir(module.layers))
    x = torch.randn(200, 64)
    w = torch.randn(64)
    got = module.rmsnorm_kernel(x.to("neuron"), w.to("neuron"), 1e-6)
    assert got.device.type == "neuron"
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5)


class _CountCalls:
    """Counts launches of an NKI kernel (wraps Kernel.run on the instance)."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.calls = 0

    def __enter__(self):
        original = self.kernel.run

        def counting(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)

        self.kernel.run = counting
        return self

    def __exit__(self, *exc):
        del self.kernel.run


def _kernelize(model, mapping):
    from kernels import Mode, kernelize, use_kernel_mapping

    with use_kernel_mapping(mapping, inherit_mapping=False):
        return kernelize(model, mode=Mode.INFERENCE, device="neuron")


def test_llama_rmsnorm_swapped_in_matches_the_model():
    from kernels import LocalLayerRepository, replace_kernel_forward_from_hub
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    # transformers 5.24's @use_kernel_forward_from_hub is inert with kernels 0.17 (it wants
    # >=0.18.2): mark the class with kernels' own function, as that decorator would.
    replace_kernel_forward_from_hub(LlamaRMSNorm, "RMSNorm")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM(config).eval().to("neuron")
    for module in model.modules():  # non-trivial weights, so the weight is really applied
        if type(module).__name__ == "LlamaRMSNorm":
            module.weight.data.uniform_(0.5, 1.5)
    ids = torch.randint(0, 128, (2, 40)).to("neuron")
    with torch.no_grad():
        expected = model(ids).logits.cpu()
    repo = LocalLayerRepository(repo_path=REPO, layer_name="RMSNorm")
    model = _kernelize(model, {"RMSNorm": {"neuron": repo}})
    module = kernels.get_local_kernel(REPO)
    with _CountCalls(module.rmsnorm_kernel) as counter, torch.no_grad():
        got = model(ids).logits.cpu()
    assert counter.calls == 2 * 2 + 1  # two norms per decoder layer, one final norm
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def _tiny_vit():
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(0)
    config = ViTConfig(
        image_size=32,
        patch_size=4,  # 64 patches + [CLS] = 65 tokens
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
    )
    return ViTModel(config, add_pooling_layer=False).eval()


def test_vit_fused_attention_swapped_in_matches_the_model():
    from kernels import LocalLayerRepository, replace_kernel_forward_from_hub
    from transformers.models.vit.modeling_vit import ViTAttention

    replace_kernel_forward_from_hub(ViTAttention, "ViTAttention")
    model = _tiny_vit().to("neuron")
    pixels = torch.randn(2, 3, 32, 32).to("neuron")
    with torch.no_grad():
        expected = model(pixel_values=pixels).last_hidden_state.cpu()
    repo = LocalLayerRepository(repo_path=REPO, layer_name="ViTAttention")
    model = _kernelize(model, {"ViTAttention": {"neuron": repo}})
    module = kernels.get_local_kernel(REPO)
    with _CountCalls(module.vit_attention_kernel) as counter, torch.no_grad():
        got = model(pixel_values=pixels).last_hidden_state
    assert counter.calls == 2  # one fused attention per encoder layer
    assert got.device.type == "neuron"
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-4, atol=1e-4)


def test_vit_attention_kernel_at_vit_s_length_fuses_each_query_tiles_products():
    # 197 tokens (ViT-S/16): two key blocks per query tile. Compiled, each tile's P@V over
    # nc_transpose'd probability blocks and v[b, h, rows, :] is one matmul (fusion.py).
    module = kernels.get_local_kernel(REPO)
    q, k, v = (torch.randn(1, 197, 2, 64) for _ in range(3))
    expected = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=0.125
    ).transpose(1, 2)
    args = (q.permute(0, 2, 3, 1), k.permute(0, 2, 3, 1), v.permute(0, 2, 1, 3), 0.125)
    module.vit_attention_kernel(*args)  # traces and compiles
    got = module.vit_attention_kernel(*args)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    compiled = list(module.vit_attention_kernel._cache.values())[-1]  # this signature's
    assert ".add_(" not in compiled.program.source, compiled.program.source
