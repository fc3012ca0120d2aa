"""The fused attention ops on neuron (csrc/aten/attention/fused_attention.cpp) and what uses them.

aten::_scaled_dot_product_flash_attention and _scaled_dot_product_efficient_attention, forward
and backward: without dropout they run the CPU's flash kernel, so outputs, logsumexp and
gradients equal the CPU kernel's bit for bit (queries of more than 8 rows: fewer may take the
native decode kernel), and match attention's definition computed in float64 within the
float32 kernel's rounding. With dropout they compute the definition with a keep-mask that
the returned seed regenerates (torch.rand(..., generator=manual_seed(seed)) >= p on the CPU):
compared with the float64 definition under that mask. SDPA keeps the CPU's op for plain
tensors and chooses efficient attention for DTensor, so context parallel's ring attention
(2 ranks, all-gather and all-to-all rotation, with and without load balancing) equals full
attention on one device.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from support.ranks import run_ranks

aten = torch.ops.aten
B, H, L, S, E = 2, 3, 24, 40, 16  # more than 8 query rows: the CPU kernel, not decode's
# float32 against the float64 definition: the kernel's softmax and products round in float32
# over S terms (a few units of 2**-24 per element, S terms per sum): 2**-14 relative to the
# magnitudes involved. bfloat16 outputs round once more, to 8 bits: 2**-7.
TOL = {
    torch.float32: {"rtol": 2**-14, "atol": 2**-14},
    torch.bfloat16: {"rtol": 2**-7, "atol": 2**-7},
}


def inputs(dtype: torch.dtype, rows: int = L, cols: int = S, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, E, generator=g).to(dtype) for n in (rows, cols, cols)]


def definition(q, k, v, bias=None, causal=False, scale=None, keep=None):
    """Attention from its definition in float64: (output, logsumexp)."""
    q, k, v = (t.double() for t in (q, k, v))
    scores = q @ k.transpose(-2, -1) * (scale if scale is not None else 1 / math.sqrt(E))
    if causal:
        above = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).triu(1)
        scores = scores.masked_fill(above, float("-inf"))
    if bias is not None:
        scores = scores + bias.double()
    lse = scores.logsumexp(-1)
    probs = (scores - lse.unsqueeze(-1)).exp()
    if keep is not None:
        probs = probs * keep
    return probs @ v, lse


def on_neuron(*tensors: torch.Tensor, grad: bool = False) -> list[torch.Tensor]:
    return [t.to("neuron").requires_grad_(grad) for t in tensors]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_matches_the_cpu_kernel_and_the_definition(dtype, causal) -> None:
    q, k, v = inputs(dtype)
    qd, kd, vd = on_neuron(q, k, v, grad=True)
    out, lse, *_, rng_state, _, _ = aten._scaled_dot_product_flash_attention(
        qd, kd, vd, 0.0, causal
    )
    assert out.device.type == "neuron" and lse.dtype == torch.float32 and lse.shape == (B, H, L)
    assert rng_state.dtype == torch.uint64 and rng_state.shape == (2,)
    cpu_out, cpu_lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
    assert torch.equal(out.cpu(), cpu_out) and torch.equal(lse.cpu(), cpu_lse)
    want_out, want_lse = definition(q, k, v, causal=causal)
    torch.testing.assert_close(out.cpu().double(), want_out, **TOL[dtype])
    torch.testing.assert_close(lse.cpu().double(), want_lse, **TOL[torch.float32])
    # backward through autograd (the op's derivative is the flash backward)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(dtype)
    out.backward(grad.to("neuron"))
    qc, kc, vc = (t.double().requires_grad_() for t in (q, k, v))
    definition(qc, kc, vc, causal=causal)[0].backward(grad.double())
    for got, want in ((qd.grad, qc.grad), (kd.grad, kc.grad), (vd.grad, vc.grad)):
        torch.testing.assert_close(got.cpu().double(), want, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no-bias", "bias"])
def test_efficient_attention_matches_the_definition(dtype, causal, with_bias) -> None:
    q, k, v = inputs(dtype)
    bias = torch.randn(1, H, L, S, generator=torch.Generator().manual_seed(3)).to(dtype)
    args = on_neuron(q, k, v, grad=True)
    bias_d = bias.to("neuron").requires_grad_() if with_bias else None
    out, lse, seed, offset = aten._scaled_dot_product_efficient_attention(
        *args, bias_d, True, 0.0, causal
    )
    # the output in CUDA's layout (a (batch, heads) transpose), the logsumexp in ROCm's (one
    # column per query row; CUDA pads to 32, which context parallel's merge does not accept)
    assert out.shape == (B, H, L, E) and out.transpose(1, 2).is_contiguous()
    assert lse.shape == (B, H, L)
    no_lse = aten._scaled_dot_product_efficient_attention(*args, bias_d, False, 0.0, causal)[1]
    assert no_lse.shape == (B, H, 0)
    want_out, want_lse = definition(q, k, v, bias if with_bias else None, causal)
    torch.testing.assert_close(out.cpu().double(), want_out, **TOL[dtype])
    torch.testing.assert_close(lse.cpu().double(), want_lse, **TOL[torch.float32])
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(dtype)
    out.backward(grad.to("neuron"))
    ref = [t.double().requires_grad_() for t in (q, k, v, bias)]
    definition(*ref[:3], ref[3] if with_bias else None, causal)[0].backward(grad.double())
    pairs = list(zip([a.grad for a in args], [r.grad for r in ref[:3]], strict=True))
    if with_bias:  # the bias's gradient (from the definition's backward)
        pairs.append((bias_d.grad, ref[3].grad))
    for got, want in pairs:
        torch.testing.assert_close(got.cpu().double(), want, **TOL[dtype])


def keep_mask(seed: int, p: float, rows: int = L, cols: int = S) -> torch.Tensor:
    """The documented mask of a dropout seed, scaled by 1 / (1 - p)."""
    uniform = torch.rand(B, H, rows, cols, generator=torch.Generator().manual_seed(seed))
    return (uniform >= p).double() / (1 - p)


@pytest.mark.parametrize("op", ["flash", "efficient"])
@pytest.mark.parametrize("causal", [False, True])
def test_dropout_uses_the_returned_seed_in_forward_and_backward(op, causal) -> None:
    p = 0.3
    q, k, v = inputs(torch.float32)
    args = on_neuron(q, k, v, grad=True)
    torch.neuron.manual_seed(11)
    if op == "flash":
        out, lse, *_, rng_state, _, _ = aten._scaled_dot_product_flash_attention(*args, p, causal)
        seed = int(rng_state.cpu().to(torch.int64)[0])
    else:
        out, lse, seed_t, _ = aten._scaled_dot_product_efficient_attention(
            *args, None, True, p, causal
        )
        seed = int(seed_t.cpu())
    keep = keep_mask(seed, p)
    assert 0.6 < (keep > 0).double().mean().item() < 0.8  # about 1 - p kept
    want_out, _ = definition(q, k, v, causal=causal, keep=keep)
    torch.testing.assert_close(out.cpu().double(), want_out, **TOL[torch.float32])
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
    out.backward(grad.to("neuron"))
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    definition(*ref, causal=causal, keep=keep)[0].backward(grad.double())
    for got, want in zip([a.grad for a in args], [r.grad for r in ref], strict=True):
        torch.testing.assert_close(got.cpu().double(), want, **TOL[torch.float32])
    # the neuron generator's seed decides the mask: the same seed, the same output
    torch.neuron.manual_seed(11)
    again = (
        aten._scaled_dot_product_flash_attention(*args, p, causal)[0]
        if op == "flash"
        else aten._scaled_dot_product_efficient_attention(*args, None, True, p, causal)[0]
    )
    assert torch.equal(again.cpu(), out.detach().cpu())


def test_bad_inputs_raise_clear_errors() -> None:
    q, k, v = on_neuron(*inputs(torch.float32))
    with pytest.raises(RuntimeError, match="as many key/value heads as query heads"):
        aten._scaled_dot_product_flash_attention(q, k[:, :1], v[:, :1])
    with pytest.raises(RuntimeError, match="debug mask"):
        aten._scaled_dot_product_flash_attention(q, k, v, 0.0, False, True)
    with pytest.raises(RuntimeError, match=r"\(batch, heads, sequence, head_dim\)"):
        aten._scaled_dot_product_efficient_attention(q[0], k[0], v[0], None, True)


def test_sdpa_keeps_the_cpu_op_for_plain_tensors() -> None:
    q, k, v = on_neuron(*inputs(torch.float32))
    torch.neuron.clear_op_tracking()
    F.scaled_dot_product_attention(q, k, v)
    executed = torch.neuron.get_executed_ops()
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in executed, executed
    assert "aten::_scaled_dot_product_efficient_attention" not in executed, executed


def test_sdpa_kernel_efficient_attention_runs_the_efficient_op() -> None:
    """sdpa_kernel(EFFICIENT_ATTENTION) on plain tensors: the CPU has no such kernel (its choice
    finds no backend); neuron runs its efficient attention, as CUDA would."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = inputs(torch.float32)
    torch.neuron.clear_op_tracking()
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        out = F.scaled_dot_product_attention(*on_neuron(q, k, v), is_causal=True)
        with pytest.raises(RuntimeError, match="No viable backend"):
            F.scaled_dot_product_attention(q, k, v)  # the CPU's choice, for comparison
    assert "aten::_scaled_dot_product_efficient_attention" in torch.neuron.get_executed_ops()
    torch.testing.assert_close(
        out.cpu().double(), definition(q, k, v, causal=True)[0], **TOL[torch.float32]
    )


# --- context parallel --------------------------------------------------------------------

CP_B, CP_H, CP_L, CP_E = 2, 4, 64, 16


def _context_parallel(rank: int, size: int, rotate: str, load_balance: bool) -> bytes:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import (
        _cp_options,
        context_parallel_unshard,
        set_rotate_method,
    )

    set_rotate_method(rotate)
    _cp_options.enable_load_balance = load_balance
    mesh = init_device_mesh("neuron", (size,))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(CP_B, CP_H, CP_L, CP_E, generator=g) for _ in range(3))
    grad = torch.randn(CP_B, CP_H, CP_L, CP_E, generator=g)
    results = {}
    for causal in (True,) if load_balance else (False, True):  # balancing needs causal
        # full attention on this rank's device
        full = [t.to("neuron").requires_grad_() for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*full, is_causal=causal)
        out.backward(grad.to("neuron"))
        # the same through context parallel: sequences sharded over the ranks
        cp = [t.to("neuron") for t in (q, k, v)]
        cp_grad = grad.to("neuron")
        with context_parallel(mesh, buffers=[*cp, cp_grad], buffer_seq_dims=[2, 2, 2, 2]):
            for t in cp:
                t.requires_grad_()
            cp_out = F.scaled_dot_product_attention(*cp, is_causal=causal)
            cp_out.backward(cp_grad)
            for t in cp:  # the context restores the buffers' shapes on exit: leaves may not
                t.requires_grad_(False)
        gathered = context_parallel_unshard(
            mesh, [cp_out.detach(), *(t.grad for t in cp)], [2, 2, 2, 2]
        )
        results[causal] = {
            "full": [out.detach().cpu(), *(t.grad.cpu() for t in full)],
            "cp": [t.cpu() for t in gathered],
        }
    buffer = io.BytesIO()
    torch.save(results, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("rotate", ["allgather", "alltoall"])
@pytest.mark.parametrize("load_balance", [False, True], ids=["plain", "load-balanced"])
def test_context_parallel_equals_full_attention(rotate, load_balance) -> None:
    saved = run_ranks(_context_parallel, 2, "neuron", rotate, load_balance)
    for rank, data in saved.items():
        for causal, result in torch.load(io.BytesIO(data)).items():
            for name, got, want in zip(
                ("output", "dq", "dk", "dv"), result["cp"], result["full"], strict=True
            ):
                # ring attention merges per-block results through their logsumexp in float32
                torch.testing.assert_close(
                    got, want, rtol=2**-16, atol=2**-16,
                    msg=lambda m, n=name, r=rank, c=causal: f"rank {r} causal={c} {n}: {m}",
                )  # fmt: skip


def _heads_sharded(rank: int, size: int) -> bytes:
    """SDPA on DTensors sharded over heads (tensor parallel): efficient attention through
    DTensor's own strategy; returns (op names executed, full output, gathered output)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("neuron", (size,))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(CP_B, CP_H, CP_L, CP_E, generator=g).to("neuron") for _ in range(3))
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    sharded = [distribute_tensor(t, mesh, [Shard(1)]) for t in (q, k, v)]
    torch.neuron.clear_op_tracking()
    out = F.scaled_dot_product_attention(*sharded, is_causal=True)
    executed = sorted(torch.neuron.get_executed_ops())
    # the user's restriction holds: flash only keeps the CPU's op, which DTensor cannot shard
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), pytest.raises(NotImplementedError):
        F.scaled_dot_product_attention(*sharded, is_causal=True)
    buffer = io.BytesIO()
    torch.save((executed, full.cpu(), out.full_tensor().cpu()), buffer)
    return buffer.getvalue()


def test_sdpa_on_dtensors_runs_efficient_attention_per_shard() -> None:
    for rank, data in run_ranks(_heads_sharded, 2, "neuron").items():
        executed, full, gathered = torch.load(io.BytesIO(data))
        assert "aten::_scaled_dot_product_efficient_attention" in executed, (rank, executed)
        # each rank computes whole heads with the same kernel: equal to full attention
        assert torch.equal(gathered, full), (rank, (gathered - full).abs().max())


# --- varlen_attn (aten::_flash_attention_forward/_backward) ------------------------------

LENGTHS_Q, LENGTHS_K = [5, 12, 1, 9], [7, 12, 4, 9]


def _window_visible(q_len: int, k_len: int, left: int, right: int) -> torch.Tensor:
    """FlashAttention's mask: query i sees key j within the window around its bottom-right
    aligned diagonal i + k_len - q_len (-1: unbounded)."""
    i = torch.arange(q_len).unsqueeze(1) + (k_len - q_len)
    j = torch.arange(k_len).unsqueeze(0)
    visible = torch.ones(q_len, k_len, dtype=torch.bool)
    if left >= 0:
        visible &= j >= i - left
    if right >= 0:
        visible &= j <= i + right
    return visible


@pytest.mark.parametrize(
    ("window", "kv_heads"),
    [((-1, -1), 4), ((-1, 0), 4), ((3, 0), 4), ((2, 1), 4), ((-1, 0), 2)],
    ids=["full", "causal", "causal-window", "window", "causal-gqa"],
)
def test_varlen_attn_matches_attention_per_sequence(window, kv_heads) -> None:
    from torch.nn.attention.varlen import varlen_attn

    heads, dim = 4, 8
    g = torch.Generator().manual_seed(0)
    q = torch.randn(sum(LENGTHS_Q), heads, dim, generator=g)
    k = torch.randn(sum(LENGTHS_K), kv_heads, dim, generator=g)
    v = torch.randn(sum(LENGTHS_K), kv_heads, dim, generator=g)
    grad = torch.randn(q.shape, generator=g)
    cu_q = torch.tensor([0, *torch.tensor(LENGTHS_Q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(LENGTHS_K).cumsum(0).tolist()], dtype=torch.int32)
    qd, kd, vd = on_neuron(q, k, v, grad=True)
    out = varlen_attn(
        qd, kd, vd, cu_q.to("neuron"), cu_k.to("neuron"), max(LENGTHS_Q), max(LENGTHS_K),
        window_size=window, enable_gqa=kv_heads != heads,
    )  # fmt: skip
    out.backward(grad.to("neuron"))
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    pieces = []
    for i, (lq, lk) in enumerate(zip(LENGTHS_Q, LENGTHS_K, strict=True)):
        q0, k0 = int(cu_q[i]), int(cu_k[i])
        qs = ref[0][q0 : q0 + lq].transpose(0, 1)
        ks, vs = (t[k0 : k0 + lk].transpose(0, 1) for t in ref[1:])
        ks, vs = (t.repeat_interleave(heads // kv_heads, 0) for t in (ks, vs))
        scores = qs @ ks.transpose(-2, -1) / math.sqrt(dim)
        scores = scores.masked_fill(~_window_visible(lq, lk, *window), float("-inf"))
        pieces.append((scores.softmax(-1) @ vs).transpose(0, 1))
    want = torch.cat(pieces)
    want.backward(grad.double())
    torch.testing.assert_close(out.detach().cpu().double(), want, **TOL[torch.float32])
    for got, expected in zip((qd.grad, kd.grad, vd.grad), (r.grad for r in ref), strict=True):
        torch.testing.assert_close(got.cpu().double(), expected, **TOL[torch.float32])


def test_varlen_attn_refuses_what_it_does_not_support() -> None:
    q, k, v = on_neuron(*(torch.randn(6, 2, 8) for _ in range(3)))
    cu = torch.tensor([0, 6], dtype=torch.int32, device="neuron")
    with pytest.raises(RuntimeError, match="paged key/value cache"):
        aten._flash_attention_forward(
            q, k, v, cu, cu, 6, 6, 0.0, False, False,
            block_table=torch.zeros(1, 1, dtype=torch.int32, device="neuron"),
        )  # fmt: skip
    with pytest.raises(RuntimeError, match="dropout"):
        aten._flash_attention_forward(q, k, v, cu, cu, 6, 6, 0.5, False, False)


def _eager_and_compiled(
    attend: Callable[..., torch.Tensor], *inputs: torch.Tensor
) -> list[list[torch.Tensor]]:
    """[output, input gradients...] of `attend` on neuron, eager and then compiled by the
    neuron backend (fullgraph), for the sum of its output."""
    results = []
    torch._dynamo.reset()
    for fn in (attend, torch.compile(attend, backend="neuron", fullgraph=True)):
        on_device = on_neuron(*inputs, grad=True)
        out = fn(*on_device)
        out.sum().backward()
        results.append([t.detach().cpu() for t in (out, *(x.grad for x in on_device))])
    return results


def test_varlen_attn_compiled_equals_eager() -> None:
    """varlen_attn in a graph compiled by the neuron backend (forward and backward): the graph
    runs on the host, where torch_attn's implementation would find no CPU flash kernel; the
    backend points it at neuron's implementation (compile/device_only_ops.py). Not bitwise:
    eager neuron runs sequences of at most 8 queries on the native decode kernel, the host
    graph the CPU's flash kernel; both are within float32 rounding of each other."""
    from torch.nn.attention.varlen import varlen_attn

    heads, kv_heads, dim = 4, 2, 8
    g = torch.Generator().manual_seed(1)
    q = torch.randn(sum(LENGTHS_Q), heads, dim, generator=g)
    k = torch.randn(sum(LENGTHS_K), kv_heads, dim, generator=g)
    v = torch.randn(sum(LENGTHS_K), kv_heads, dim, generator=g)
    cu_q = torch.tensor([0, *torch.tensor(LENGTHS_Q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(LENGTHS_K).cumsum(0).tolist()], dtype=torch.int32)
    cu_q, cu_k = cu_q.to("neuron"), cu_k.to("neuron")

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = varlen_attn(
            q, k, v, cu_q, cu_k, max(LENGTHS_Q), max(LENGTHS_K),
            window_size=(3, 0), enable_gqa=True,
        )  # fmt: skip
        return out * 2.0

    for eager, compiled in zip(*_eager_and_compiled(attend, q, k, v), strict=True):
        torch.testing.assert_close(compiled, eager, **TOL[torch.float32])


@pytest.mark.parametrize("op", ["sdpa_efficient_only", "flash_op"])
def test_compiled_fused_attention_equals_eager(op) -> None:
    """Compiled graphs run on the host, which has neither fused op: SDPA under
    sdpa_kernel(EFFICIENT_ATTENTION) and aten._scaled_dot_product_flash_attention called
    directly (Diffusers' _native_flash backend) run neuron's implementations there
    (compile/device_only_ops.py): forward and backward equal eager bit for bit. Dropout in a
    compiled graph is refused with an error naming the alternative."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = inputs(torch.float32)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if op == "flash_op":
            return aten._scaled_dot_product_flash_attention(q, k, v, is_causal=True)[0]
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        results = _eager_and_compiled(attend, q, k, v)
    for eager, compiled in zip(*results, strict=True):
        assert torch.equal(compiled, eager)

    def with_dropout(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return aten._scaled_dot_product_flash_attention(q, k, v, dropout_p=0.5)[0]

    with pytest.raises(Exception, match="not supported in graphs compiled for neuron"):
        torch.compile(with_dropout, backend="neuron", fullgraph=True)(*on_neuron(q, k, v))
