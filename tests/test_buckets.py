"""torchneuron.compile.buckets: varying sequence lengths compile once per bucket and equal eager."""

from __future__ import annotations

import pytest
import torch

from torchneuron.compile.buckets import bucket_for, pad_to_buckets
from torchneuron.fidelity.compile_audit import audit

LENGTHS = (5, 9, 13, 16, 20, 31, 7)  # buckets 16 and 32 hold them all
ATOL, RTOL = 1e-5, 1e-4  # padding changes matmul shapes, hence summation order


@pytest.fixture(autouse=True)
def fresh_dynamo() -> None:
    torch._dynamo.reset()


class Causal(torch.nn.Module):
    """Position-wise MLP then a causal cumulative mean: later pads cannot reach earlier tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.proj(x))
        steps = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype)
        return h.cumsum(1) / steps[:, None]


def test_plain_module_compiles_once_per_bucket_and_equals_eager() -> None:
    torch.manual_seed(0)
    model = Causal().to("neuron")
    wrapped = pad_to_buckets(model, buckets=(16, 32), dim=1, compile=True)
    with audit() as result:
        for n in LENGTHS:
            x = torch.randn(2, n, 8, device="neuron")
            out = wrapped(x)
            assert out.shape == (2, n, 8)
            torch.testing.assert_close(out.cpu(), model(x).cpu(), atol=ATOL, rtol=RTOL)
    assert result.compiles == 2  # 16 and 32, not one per length
    assert sorted(g.signature[-1][1][1] for g in result.graphs) == [16, 32]


def test_causal_lm_with_mask_and_labels_equals_eager() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=97,
    )
    model = LlamaForCausalLM(config).to("neuron").eval()
    wrapped = pad_to_buckets(model, buckets=(16, 32), dim=1, compile=True)
    with audit() as result, torch.no_grad():
        for n in (5, 16, 23):
            ids = torch.randint(0, 97, (2, n), device="neuron")
            got = wrapped(input_ids=ids, labels=ids, use_cache=False)
            want = model(input_ids=ids, labels=ids, use_cache=False)
            assert got.logits.shape == (2, n, 97)
            torch.testing.assert_close(got.logits.cpu(), want.logits.cpu(), atol=ATOL, rtol=RTOL)
            torch.testing.assert_close(got.loss.cpu(), want.loss.cpu(), atol=ATOL, rtol=RTOL)
    assert result.compiles == 2


def test_bucket_errors_are_clear() -> None:
    assert bucket_for(17, (16, 32)) == 32 and bucket_for(16, (32, 16)) == 16
    with pytest.raises(ValueError, match="longer than the largest bucket 32"):
        bucket_for(33, (16, 32))
    with pytest.raises(ValueError, match="positive sizes"):
        pad_to_buckets(torch.nn.Identity(), buckets=())
