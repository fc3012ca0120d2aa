"""Dynamic shapes under the default torch.compile (Inductor) on neuron tensors.

Hugging Face suites compile with ``dynamic=True, fullgraph=True`` and then call with other
sizes under ``error_on_recompile`` (diffusers' ``test_compile_on_different_shapes``): one
graph must serve every length, as on the CPU. Attention is where neuron used to differ:
the fused-kernel choice read concrete sizes, which specialised the sequence length.

References: the same function or module run eagerly on CPU. Tolerances: float32 within
atol 1e-5 / rtol 1e-4 (compiled code may fuse and reorder float arithmetic).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend

TOL = {"atol": 1e-5, "rtol": 1e-4}
LENGTHS = (16, 24, 40)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _qkv(length: int, seed: int) -> list[torch.Tensor]:
    """Query, key, value and an additive mask for a sequence of `length`."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, 4, length, 8, generator=g) for _ in range(3)] + [
        torch.randn(length, length, generator=g)
    ]


def _float_mask(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _bool_mask(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask > 0)


def _causal(q, k, v, mask=None):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@pytest.mark.parametrize("attention", [_float_mask, _bool_mask, _causal], ids=lambda f: f.__name__)
def test_dynamic_sdpa_is_one_graph_for_every_length(attention):
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(attention, backend=counter, dynamic=True, fullgraph=True)
    for length in LENGTHS:
        inputs = _qkv(length, seed=length)
        # As diffusers' test does: a second graph is an error, not a silent recompile.
        with torch._dynamo.config.patch(error_on_recompile=True):
            got = compiled(*[t.to("neuron") for t in inputs])
        assert got.device.type == "neuron"
        torch.testing.assert_close(got.cpu(), attention(*inputs), **TOL)
    assert counter.frame_count == 1


def test_dynamic_sdpa_backward_is_one_graph_and_matches_cpu():
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(_causal, backend=counter, dynamic=True, fullgraph=True)
    for length in (16, 24):
        cpu = [t.requires_grad_() for t in _qkv(length, seed=length)[:3]]
        dev = [t.detach().to("neuron").requires_grad_() for t in cpu]
        _causal(*cpu).square().sum().backward()
        with torch._dynamo.config.patch(error_on_recompile=True):
            compiled(*dev).square().sum().backward()
        for c, d in zip(cpu, dev, strict=True):
            assert d.grad.device.type == "neuron"
            torch.testing.assert_close(d.grad.cpu(), c.grad, **TOL)
    assert counter.frame_count == 1


def test_diffusers_attention_compiles_once_on_different_shapes():
    """diffusers' test_compile_on_different_shapes in small: its Attention block (SDPA
    processor) compiled dynamic and fullgraph, called at three latent sizes. Like that test,
    duck shaping is off (else the 16-token length would be unified with the 16 channels)."""
    from diffusers.models.attention_processor import Attention
    from torch.fx.experimental import _config as fx_config

    torch.manual_seed(0)
    cpu = Attention(query_dim=16, heads=2, dim_head=8).eval()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(
        copy.deepcopy(cpu).to("neuron"), backend=counter, fullgraph=True, dynamic=True
    )
    compiles = []
    for height, width in [(4, 4), (4, 8), (8, 8)]:
        g = torch.Generator().manual_seed(height * 10 + width)
        x = torch.randn(1, height * width, 16, generator=g)
        with (
            fx_config.patch(use_duck_shape=False),
            torch._dynamo.config.patch(error_on_recompile=True),
            torch.no_grad(),
        ):
            got = compiled(x.to("neuron"))
            want = cpu(x)
        torch.testing.assert_close(got.cpu(), want, **TOL)
        compiles.append(counter.frame_count)
    # The first call traces twice, as on the CPU (Dynamo restarts once to specialise the
    # module's float attributes); later shapes add nothing.
    assert compiles[0] >= 1 and compiles == [compiles[0]] * 3


def test_backend_neuron_sdpa_stays_static_per_length():
    """backend="neuron" keeps its policy: one static graph per input signature."""
    compiled = torch.compile(_causal, backend="neuron", fullgraph=True)
    torch.neuron.reset_dynamo_metrics()
    for length in (16, 24):
        q, k, v, _ = _qkv(length, seed=length)
        got = compiled(q.to("neuron"), k.to("neuron"), v.to("neuron"))
        torch.testing.assert_close(got.cpu(), _causal(q, k, v), **TOL)
    metrics = torch.neuron.get_dynamo_metrics()
    assert metrics["compiles"] == 2 and metrics["recompiles"] == 1
