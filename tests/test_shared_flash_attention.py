"""PyTorch's CPU flash attention split over the task board on neuron
(csrc/aten/attention/shared_flash_attention.cpp): two one-thread CPU calls, each on half of
the batch (of the heads for a batch of 1), joined into the kernel's own output layout.

Reference: the CPU kernel on the same inputs, which computes every (batch, head) pair alone,
so the results must be equal bit for bit, forward and backward, whatever the split.
"""

from __future__ import annotations

import pytest
import torch

import torchneuron

DEV = "neuron"
FORWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default

# name: (batch, heads, query rows, key rows, head size, mask, causal). Each problem has at
# least 2^19 multiply-adds (the split's bound) and 256 KiB of operands (launched).
CASES = {
    "batch": (2, 4, 96, 96, 64, None, True),
    "heads": (1, 6, 128, 80, 64, None, False),
    "odd_heads": (1, 5, 128, 128, 64, None, True),
    "mask_per_batch": (2, 3, 96, 96, 64, "b1ls", False),
    "mask_per_head": (1, 4, 128, 128, 64, "1hls", False),
    "mask_2d": (1, 4, 128, 128, 64, "ls", False),
    "mask_full": (2, 2, 128, 128, 64, "bhls", False),
}


def splits() -> int:
    return torchneuron._C._native_kernel_runs().get("flash_attention_split", 0)


def make(case: str, dtype: torch.dtype) -> tuple:
    b, h, lq, lk, e, mask_kind, causal = CASES[case]
    g = torch.Generator().manual_seed(len(case))
    q = torch.randn(b, h, lq, e, generator=g).to(dtype)
    k, v = (torch.randn(b, h, lk, e, generator=g).to(dtype) for _ in range(2))
    shapes = {
        "b1ls": (b, 1, lq, lk),
        "1hls": (1, h, lq, lk),
        "ls": (lq, lk),
        "bhls": (b, h, lq, lk),
    }
    mask = None
    if mask_kind is not None:  # the op takes masks of the query's dtype
        mask = torch.randn(*shapes[mask_kind], generator=g).to(dtype)
    return q, k, v, mask, causal


def on(device: str, *tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    return [None if t is None else t.to(device) for t in tensors]


def expected_splits(calls: int) -> int:
    """Blocking launches run on the caller, which has no board (no worker waits for it)."""
    if torchneuron._C._launch_blocking() or not torchneuron._C._waiters_help():
        return 0
    return calls


@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_and_backward_are_the_cpu_kernels_bit_for_bit(case: str) -> None:
    q, k, v, mask, causal = make(case, torch.float32)
    out, lse = FORWARD(q, k, v, 0.0, causal, attn_mask=mask)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(9))
    grads = BACKWARD(grad_out, q, k, v, out, lse, 0.0, causal, attn_mask=mask)
    before = splits()
    qd, kd, vd, maskd, gd = on(DEV, q, k, v, mask, grad_out)
    out_d, lse_d = FORWARD(qd, kd, vd, 0.0, causal, attn_mask=maskd)
    grads_d = BACKWARD(gd, qd, kd, vd, out_d, lse_d, 0.0, causal, attn_mask=maskd)
    assert torch.equal(out_d.cpu(), out) and torch.equal(lse_d.cpu(), lse)
    assert out_d.stride() == out.stride() and lse_d.stride() == lse.stride()
    for name, got, want in zip(("query", "key", "value"), grads_d, grads, strict=True):
        assert torch.equal(got.cpu(), want), name
        assert got.shape == want.shape, name
    assert splits() - before == expected_splits(2)


def test_bf16_forward_is_the_cpu_kernel_bit_for_bit() -> None:
    q, k, v, mask, causal = make("mask_per_batch", torch.bfloat16)
    before = splits()
    out_d, lse_d = FORWARD(*on(DEV, q, k, v), 0.0, causal, attn_mask=mask.to(DEV))
    out, lse = FORWARD(q, k, v, 0.0, causal, attn_mask=mask)
    assert torch.equal(out_d.cpu(), out) and torch.equal(lse_d.cpu(), lse)
    assert splits() - before == expected_splits(1)


def test_sdpa_in_program_order_over_many_launches() -> None:
    """Each attention reads q as the in-place op before it left it: a split that ran out of
    order, or joined into the wrong half, gives another result."""
    q, k, v, _, _ = make("batch", torch.float32)
    qd, kd, vd = on(DEV, q, k, v)
    got, want = [], []
    for _ in range(10):
        got.append(torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, is_causal=True))
        want.append(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
        qd.mul_(-1.25)
        q.mul_(-1.25)
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(g.cpu(), w), step


def test_small_and_dropout_problems_are_not_split() -> None:
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(2, 2, 16, 16, generator=g) for _ in range(3))  # 2^14 multiply-adds
    before = splits()
    out_d, _ = FORWARD(*on(DEV, q, k, v), 0.0, True)
    assert torch.equal(out_d.cpu(), FORWARD(q, k, v, 0.0, True)[0])
    assert splits() == before


def test_inference_mode_results_are_written_by_any_helper() -> None:
    """Results made under inference mode are inference tensors; a thread that helps the split
    outside that mode (the caller synchronizing after the block) must still write them."""
    q, k, v, _, _ = make("batch", torch.float32)
    qd, kd, vd = on(DEV, q, k, v)
    with torch.inference_mode():
        got = [torch.nn.functional.scaled_dot_product_attention(qd, kd, vd) for _ in range(8)]
    torch.neuron.synchronize()  # outside the mode: the caller helps the queued splits
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    for g in got:
        assert torch.equal(g.cpu(), want)
