"""The flash-attention backward on neuron (csrc/aten/attention/attention_backward_widened.cpp).

On hosts without native bf16 its bf16 form (from 16 x 16 x 32 per head) widens the operands
to float32, runs the float32 backward and rounds the gradients once; elsewhere, below that
size, and in float32, it is the CPU kernel.
References: the CPU's float32 backward on the same widened operands (exact), and the CPU's
own bf16 backward (bf16 tolerance).
"""

from __future__ import annotations

import pytest
import torch

import torchneuron

DEVICE = torch.device("neuron:0")
BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
FORWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
HOST_LACKS_BF16 = torchneuron._C._kernel_isa()["isa"] in ("scalar", "avx2", "avx512")


def widened_runs() -> int:
    return torchneuron._C._native_kernel_runs().get("flash_attention_backward_widened", 0)


def operands(dtype: torch.dtype, mask: bool) -> tuple:
    """CPU forward results and a gradient: (grad_out, q, k, v, out, lse, attn_mask)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 48, 32, generator=g).to(dtype) for _ in range(3))
    attn_mask = None
    if mask:
        attn_mask = (torch.randn(48, 48, generator=g) * 2).to(dtype)
    out, lse = FORWARD(q, k, v, 0.0, not mask, attn_mask=attn_mask)
    grad_out = torch.randn(out.shape, generator=g).to(dtype)
    return grad_out, q, k, v, out, lse, attn_mask


def backward(args: tuple, device: torch.device | str) -> tuple:
    grad_out, q, k, v, out, lse, attn_mask = (None if t is None else t.to(device) for t in args)
    return BACKWARD(grad_out, q, k, v, out, lse, 0.0, attn_mask is None, attn_mask=attn_mask)


@pytest.mark.parametrize("mask", [False, True], ids=["causal", "bf16_mask"])
def test_bf16_backward_matches_the_float32_backward_rounded_once(mask: bool) -> None:
    args = operands(torch.bfloat16, mask)
    before = widened_runs()
    got = [g.cpu() for g in backward(args, DEVICE)]
    widened = widened_runs() - before
    assert widened == (1 if HOST_LACKS_BF16 else 0)
    own_bf16 = backward(args, "cpu")
    exact = backward(tuple(None if t is None else t.float() for t in args), "cpu")
    for name, g, e, c in zip(("query", "key", "value"), got, exact, own_bf16, strict=True):
        assert g.dtype == torch.bfloat16
        if HOST_LACKS_BF16:
            # The same float32 kernel on the same operands, rounded once: bit for bit.
            torch.testing.assert_close(g, e.to(torch.bfloat16), rtol=0, atol=0, msg=name)
        else:
            torch.testing.assert_close(g, c, rtol=0, atol=0, msg=name)
        # Against the CPU's own bf16 kernel, which rounds between its GEMMs: within a few
        # bf16 units of the largest gradient (2^-8 relative per rounding, several roundings).
        scale = e.abs().max().item()
        torch.testing.assert_close(g.float(), c.float(), rtol=2**-6, atol=4 * 2**-8 * scale)


def test_small_bf16_backward_is_the_cpu_kernel() -> None:
    # 8 rows × 8 × 16 per head: below the size where widening pays, the CPU's bf16 kernel.
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 2, 8, 16, generator=g).to(torch.bfloat16) for _ in range(3))
    out, lse = FORWARD(q, k, v, 0.0, True)
    args = (torch.randn(out.shape, generator=g).to(torch.bfloat16), q, k, v, out, lse, None)
    before = widened_runs()
    got = backward(args, DEVICE)
    assert widened_runs() == before
    for g_, c in zip(got, backward(args, "cpu"), strict=True):
        torch.testing.assert_close(g_.cpu(), c, rtol=0, atol=0)


def test_float32_backward_is_the_cpu_kernel() -> None:
    args = operands(torch.float32, mask=False)
    before = widened_runs()
    got = backward(args, DEVICE)
    assert widened_runs() == before
    for g, c in zip(got, backward(args, "cpu"), strict=True):
        torch.testing.assert_close(g.cpu(), c, rtol=0, atol=0)


def test_autograd_reaches_it_through_scaled_dot_product_attention() -> None:
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 40, 16, generator=g, dtype=torch.bfloat16) for _ in range(3))
    grads = {}
    before = widened_runs()
    for device in ("cpu", DEVICE):
        leaves = [t.detach().to(device).requires_grad_() for t in (q, k, v)]
        out = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=True)
        out.float().square().sum().backward()
        grads[str(device)] = [t.grad.cpu().float() for t in leaves]
    assert widened_runs() - before == (1 if HOST_LACKS_BF16 else 0)
    for got, want in zip(grads[str(DEVICE)], grads["cpu"], strict=True):
        scale = want.abs().max().item()
        torch.testing.assert_close(got, want, rtol=2**-6, atol=4 * 2**-8 * scale)


def test_compiled_graphs_take_it_too() -> None:
    """The neuron backend retargets the bf16 backward node; its gradients are the eager
    op's bit for bit (the same float32 kernel on the same operands)."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 40, 16, generator=g, dtype=torch.bfloat16) for _ in range(3))

    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    grads = {}
    for name, fn in (
        ("eager", attention),
        ("compiled", torch.compile(attention, backend="neuron")),
    ):
        leaves = [t.detach().to(DEVICE).requires_grad_() for t in (q, k, v)]
        before = widened_runs()
        fn(*leaves).float().square().sum().backward()
        assert widened_runs() - before == (1 if HOST_LACKS_BF16 else 0), name
        grads[name] = [t.grad.cpu() for t in leaves]
    for got, want in zip(grads["compiled"], grads["eager"], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
