"""Nested tensors on neuron run PyTorch's nested kernels for the CPU over device memory
(csrc/aten/ops/nested_tensor_kernels.cpp); results are checked against the CPU, bitwise."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

DEVICE = torch.device("neuron:0")


@pytest.fixture(autouse=True)
def _quiet_prototype_warning():
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors")
        yield


def _padded(t: torch.Tensor) -> torch.Tensor:
    return t.to_padded_tensor(0.0).cpu()


def test_transformer_encoder_inference_fast_path_matches_cpu():
    # eval + no_grad + a padding mask: TransformerEncoder turns the batch into a nested
    # tensor (PyTorch lists privateuse1 among the fast path's devices) and runs the fused
    # _transformer_encoder_layer_fwd on it. This raised NotImplementedError on neuron.
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, 2).eval()
    x = torch.randn(2, 5, 8)
    mask = torch.tensor([[False, False, False, True, True], [False] * 5])
    on_device = copy.deepcopy(encoder).to(DEVICE)
    with torch.no_grad():
        expected = encoder(x, src_key_padding_mask=mask)
        got = on_device(x.to(DEVICE), src_key_padding_mask=mask.to(DEVICE))
    assert got.device == DEVICE and not got.is_nested
    torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)


def test_nested_tensor_moves_and_computes_like_cpu():
    torch.manual_seed(0)
    parts = [torch.randn(2, 3), torch.randn(4, 3)]
    nested = torch.nested.nested_tensor(parts)
    on_device = nested.to(DEVICE)
    assert on_device.is_nested and on_device.device == DEVICE
    assert all(t.device == DEVICE for t in on_device.unbind())
    back = on_device.cpu()
    assert back.is_nested and back.device.type == "cpu"
    for got, part in zip(back.unbind(), parts, strict=True):
        assert torch.equal(got, part)
    assert torch.equal(_padded(on_device), nested.to_padded_tensor(0.0))

    weight = torch.randn(5, 3)
    linear = F.linear(on_device, weight.to(DEVICE))
    assert linear.is_nested and linear.device == DEVICE
    assert torch.equal(_padded(linear), F.linear(nested, weight).to_padded_tensor(0.0))
    assert torch.equal(_padded(on_device * 2), (nested * 2).to_padded_tensor(0.0))

    same = on_device.mul_(3)
    assert same is on_device
    assert torch.equal(_padded(on_device), (nested * 3).to_padded_tensor(0.0))


def test_nested_views_share_device_memory():
    parts = [torch.arange(6.0).reshape(2, 3), torch.arange(12.0).reshape(4, 3)]
    on_device = torch.nested.nested_tensor(parts).to(DEVICE)
    chunks = on_device.chunk(3, -1)
    assert all(c._is_view() and c.device == DEVICE for c in chunks)
    for i, chunk in enumerate(chunks):
        for got, part in zip(chunk.unbind(), parts, strict=True):
            assert torch.equal(got.cpu(), part[:, i : i + 1])
    on_device.mul_(-1)  # the views see writes to their base
    assert torch.equal(chunks[1].unbind()[1].cpu(), -parts[1][:, 1:2])
