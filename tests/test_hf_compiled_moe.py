"""Transformers' default generation path for a mixture-of-experts model on `neuron`.

On a neuron device a static cache makes Transformers compile the forward with backend
"neuron". AFMoE's expert routing traces a tensor constant into the graph; the backend once
copied it to the host inside the graph's FakeTensorMode (losing its value) and then failed
to hash it (`.numpy() is not supported for tensor subclasses`). Reference: the same weights
generating eagerly on the CPU; greedy tokens must be identical.
"""

from __future__ import annotations

import copy

import torch


def _tiny_afmoe():  # noqa: ANN202 - transformers type
    from transformers import AfmoeConfig, AfmoeForCausalLM

    config = AfmoeConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=1,  # one mixture-of-experts layer
        num_dense_layers=0,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
        num_experts=4,
        num_experts_per_tok=2,
        num_shared_experts=1,
        sliding_window=8,
        layer_types=["sliding_attention"],  # its mask holds the tensor constant
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    return AfmoeForCausalLM(config).eval()


def test_afmoe_default_compiled_generation_matches_cpu_eager():
    cpu = _tiny_afmoe()
    dev = copy.deepcopy(cpu).to("neuron")
    assert dev._default_compile_config().backend == "neuron"
    ids = torch.randint(3, 64, (2, 6), generator=torch.Generator().manual_seed(5))
    kwargs = {
        "max_new_tokens": 5,
        "min_new_tokens": 5,
        "do_sample": False,
        "pad_token_id": 0,
        "cache_implementation": "static",
    }
    expected = cpu.generate(ids, disable_compile=True, **kwargs)
    torch.neuron.reset_dynamo_metrics()
    got = dev.generate(ids.to("neuron"), **kwargs)  # the default: compiled on neuron
    assert hasattr(dev, "_compiled_call")  # Transformers did take the compiled path
    assert torch.neuron.get_dynamo_metrics()["unique_graphs"] >= 1
    assert got.device.type == "neuron"
    assert got.cpu().tolist() == expected.tolist()
