"""Hugging Face libraries detect neuron through their own code, and a tiny Llama runs on it."""

from __future__ import annotations

import copy
import importlib.metadata
import importlib.util

import pytest
import torch
from conftest import tiny_llama as build_tiny_llama

LOGITS_TOL = {"rtol": 1e-5, "atol": 1e-5}


def test_torch_neuronx_importable_with_version():
    assert importlib.util.find_spec("torch_neuronx") is not None
    import torch_neuronx

    assert isinstance(torch_neuronx.__version__, str) and torch_neuronx.__version__
    assert torch_neuronx.__version__ == importlib.metadata.version("torch-neuronx")
    assert hasattr(torch, "neuron")


def test_torch_neuronx_distribution_metadata():
    version = importlib.metadata.version("torch-neuronx")
    assert version[0].isdigit()
    dist = importlib.metadata.distribution("torch-neuronx")
    assert dist.metadata["Name"].replace("_", "-").lower() == "torch-neuronx"


def test_accelerate_detects_neuron():
    from accelerate.utils import is_neuron_available
    from accelerate.utils.imports import get_torch_accelerator_backend

    assert is_neuron_available() is True
    assert is_neuron_available(check_device=True) is True
    name, module = get_torch_accelerator_backend()
    assert name == "neuron"
    assert module is torch.neuron


def test_accelerate_state_uses_neuron():
    from accelerate import PartialState

    assert PartialState().device.type == "neuron"


def test_transformers_detects_neuron():
    from transformers.utils import import_utils

    assert import_utils.is_torch_neuron_available() is True
    assert import_utils.is_torch_neuron_available(check_device=True) is True


def test_diffusers_detects_neuron():
    from diffusers.utils import is_torch_neuronx_available
    from diffusers.utils.torch_utils import get_device

    assert is_torch_neuronx_available() is True
    assert get_device() == "neuron"


@pytest.fixture(scope="module")
def llama_pair():
    cpu = build_tiny_llama(
        hidden_size=64, intermediate_size=128, num_key_value_heads=4, vocab_size=128
    ).eval()
    neuron = copy.deepcopy(cpu).to("neuron")
    return cpu, neuron


def test_tiny_llama_logits_match_cpu(llama_pair):
    cpu, neuron = llama_pair
    assert all(p.device.type == "neuron" for p in neuron.parameters())
    torch.manual_seed(1)
    ids = torch.randint(3, 128, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding in the second row
    with torch.no_grad():
        expected = cpu(input_ids=ids, attention_mask=mask).logits
        got = neuron(input_ids=ids.to("neuron"), attention_mask=mask.to("neuron")).logits
    assert got.device.type == "neuron"
    torch.testing.assert_close(got.cpu(), expected, **LOGITS_TOL)


def test_tiny_llama_greedy_generate_matches_cpu(llama_pair):
    cpu, neuron = llama_pair
    torch.manual_seed(2)
    ids = torch.randint(3, 128, (1, 6))
    kwargs = {"max_new_tokens": 10, "do_sample": False, "min_new_tokens": 10}
    expected = cpu.generate(ids, **kwargs)
    got = neuron.generate(ids.to("neuron"), **kwargs)
    assert got.device.type == "neuron"
    assert got.shape == (1, 16)
    assert got.cpu().tolist() == expected.tolist()


def test_tiny_llama_training_step_matches_cpu(llama_pair):
    cpu, neuron = llama_pair
    cpu_model = copy.deepcopy(cpu).train()
    dev_model = copy.deepcopy(neuron).train()
    torch.manual_seed(3)
    ids = torch.randint(3, 128, (2, 10))
    for model, device in ((cpu_model, "cpu"), (dev_model, "neuron")):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loss = model(input_ids=ids.to(device), labels=ids.to(device)).loss
        loss.backward()
        opt.step()
    for (name, a), b in zip(cpu_model.named_parameters(), dev_model.parameters(), strict=True):
        torch.testing.assert_close(b.detach().cpu(), a.detach(), rtol=1e-5, atol=1e-5, msg=name)
