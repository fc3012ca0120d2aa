"""Native decode attention (csrc/kernels/sdpa_decode.h via
csrc/aten/native/native_attention_decode.cpp).

F.scaled_dot_product_attention on neuron reaches aten::_scaled_dot_product_flash_attention_for_cpu;
queries of up to 8 rows in float32/bfloat16 run our kernel, everything else PyTorch's CPU flash
kernel; compiled graphs (backend "neuron") reach the same kernel through
torchneuron::native_sdpa_decode (torchneuron/compile/native_attention.py). Every test compares with
the CPU on the same inputs.

Tolerances: float32 output rtol 1e-5, atol 1e-6 and logsumexp rtol 1e-5, atol 1e-5 (sums in
another order; our exp is within ~1 ulp). bfloat16: like the CPU's bf16 kernel, ours rounds the
probabilities to bf16 before multiplying by V, so it is compared with the CPU's kernel within
one bf16 step (rtol 2**-7) plus two probabilities rounded the other way (the two exp
implementations differ in the last float32 bits; a probability's bf16 step is at most 2**-8:
atol 2 * 2**-8 * max|v|); and, as a check on both, with the float32 computation on the same
(bf16) inputs within the probabilities' rounding (rtol 2**-6, atol 2e-2). Fallback cases run
the CPU kernel itself and must be bitwise equal.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import describe, run_python, tiny_llama

import torchneuron

OP = "aten::_scaled_dot_product_flash_attention_for_cpu"
FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
NATIVE = bool(torchneuron._C._native_kernels_enabled())
DTYPES = [torch.float32, torch.bfloat16]
NEG_INF = float("-inf")


def runs() -> int:
    return dict(torchneuron._C._native_kernel_runs()).get(OP, 0)


def rand(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def dev(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    return [None if t is None else t.to("neuron") for t in tensors]


def check_output(got: torch.Tensor, q, k, v, mask=None, enable_gqa=False) -> None:  # noqa: ANN001
    """`got` (neuron) against the CPU on the same inputs (module docstring's tolerances)."""
    got = got.cpu()
    cpu = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=enable_gqa)
    if q.dtype == torch.float32:
        torch.testing.assert_close(got, cpu, rtol=1e-5, atol=1e-6)
        return
    float_mask = mask if mask is None or mask.dtype == torch.bool else mask.float()
    exact = F.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=float_mask, enable_gqa=enable_gqa
    ).to(q.dtype)
    flipped = 2 * 2**-8 * v.float().abs().max().item()
    torch.testing.assert_close(got, cpu, rtol=2**-7, atol=flipped)
    torch.testing.assert_close(got, exact, rtol=2**-6, atol=2e-2)


def cache_mask(batch: int, length: int, used: list[int], dtype: torch.dtype) -> torch.Tensor:
    """Hugging Face's static-cache decode mask: 0 for positions < used[b], -inf after."""
    mask = torch.zeros(batch, 1, 1, length)
    for b, n in enumerate(used):
        mask[b, :, :, n:] = NEG_INF
    return mask.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [64, 128, 40])
@pytest.mark.parametrize("mask_kind", ["none", "additive", "bool"])
def test_decode_matches_cpu(dtype: torch.dtype, head_dim: int, mask_kind: str) -> None:
    batch, heads, length = 2, 4, 300
    q = rand(batch, heads, 1, head_dim, seed=1, dtype=dtype)
    k = rand(batch, heads, length, head_dim, seed=2, dtype=dtype)
    v = rand(batch, heads, length, head_dim, seed=3, dtype=dtype)
    mask = None
    if mask_kind == "additive":
        mask = cache_mask(batch, length, [100, 257], dtype)
        mask[0, 0, 0, 5] = -3.5  # finite biases too
    elif mask_kind == "bool":
        mask = torch.rand(batch, 1, 1, length, generator=torch.Generator().manual_seed(4)) > 0.3
    before = runs()
    out = F.scaled_dot_product_attention(*dev(q, k, v), attn_mask=dev(mask)[0])
    assert runs() - before == int(NATIVE)
    check_output(out, q, k, v, mask)


@pytest.mark.parametrize("dtype", DTYPES)
def test_logsumexp_and_layout_match_cpu_kernel(dtype: torch.dtype) -> None:
    # The op's second result (autograd keeps it) and both results' strides, with the query
    # in Hugging Face's layout: (batch, rows, heads, dim) transposed.
    q = rand(2, 3, 4, 64, seed=5, dtype=dtype).transpose(1, 2)
    k, v = rand(2, 4, 50, 64, seed=6, dtype=dtype), rand(2, 4, 50, 64, seed=7, dtype=dtype)
    mask = cache_mask(2, 50, [20, 50], torch.float32)
    expected = FLASH(q, k, v, attn_mask=mask)
    before = runs()
    with torch.no_grad():  # several float32 rows are native only where no backward follows
        out, lse = FLASH(*dev(q, k, v), attn_mask=dev(mask)[0])
    assert runs() - before == int(NATIVE)
    assert out.stride() == expected[0].stride() and lse.stride() == expected[1].stride()
    assert lse.dtype == torch.float32 and out.dtype == dtype
    torch.testing.assert_close(lse.cpu(), expected[1], rtol=1e-5, atol=1e-5)
    check_output(out, q, k, v, mask)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fully_and_partly_masked_rows(dtype: torch.dtype) -> None:
    # A row masked everywhere gives out 0 and logsumexp 0 (as the CPU kernel); per-head and
    # per-row masks with -inf in places.
    batch, heads, rows, length = 2, 2, 3, 40
    q = rand(batch, heads, rows, 64, seed=8, dtype=dtype)
    k, v = (
        rand(batch, heads, length, 64, seed=9, dtype=dtype),
        rand(batch, heads, length, 64, seed=10, dtype=dtype),
    )
    mask = rand(batch, heads, rows, length, seed=11)
    mask[mask > 0.5] = NEG_INF
    mask[1, 0, 2, :] = NEG_INF  # fully masked row
    mask = mask.to(dtype)
    expected_out, expected_lse = FLASH(q, k, v, attn_mask=mask)
    before = runs()
    with torch.no_grad():  # several float32 rows are native only where no backward follows
        out, lse = FLASH(*dev(q, k, v), attn_mask=dev(mask)[0])
    assert runs() - before == int(NATIVE)
    assert torch.equal(out[1, 0, 2].cpu(), torch.zeros(64, dtype=dtype))
    assert lse[1, 0, 2].item() == 0.0 == expected_lse[1, 0, 2].item()
    torch.testing.assert_close(lse.cpu(), expected_lse, rtol=1e-5, atol=1e-5)
    check_output(out, q, k, v, mask)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gqa", ["enable_gqa", "expanded"])
def test_grouped_query_heads(dtype: torch.dtype, gqa: str) -> None:
    q = rand(1, 8, 1, 64, seed=12, dtype=dtype)
    k, v = rand(1, 2, 200, 64, seed=13, dtype=dtype), rand(1, 2, 200, 64, seed=14, dtype=dtype)
    mask = cache_mask(1, 200, [150], dtype)
    before = runs()
    if gqa == "enable_gqa":
        out = F.scaled_dot_product_attention(*dev(q, k, v), attn_mask=dev(mask)[0], enable_gqa=True)
    else:  # Hugging Face's repeat_kv: expand then reshape
        kd, vd = (
            t.to("neuron")[:, :, None].expand(1, 2, 4, 200, 64).reshape(1, 8, 200, 64)
            for t in (k, v)
        )
        out = F.scaled_dot_product_attention(q.to("neuron"), kd, vd, attn_mask=dev(mask)[0])
    assert runs() - before == int(NATIVE)
    check_output(out, q, k, v, mask, enable_gqa=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_slices_of_a_static_cache(dtype: torch.dtype) -> None:
    # K/V are the first `length` positions of bigger caches, one (batch, heads, max, dim)
    # and one (batch, max, heads, dim) transposed; the mask is a slice of a bigger mask.
    batch, heads, cache_len, length = 3, 4, 512, 333
    cache_k = rand(batch, heads, cache_len, 128, seed=15, dtype=dtype).to("neuron")
    cache_v = rand(batch, cache_len, heads, 128, seed=16, dtype=dtype).to("neuron").transpose(1, 2)
    k, v = cache_k[:, :, :length], cache_v[:, :, :length]
    big_mask = cache_mask(batch, cache_len, [333, 10, 200], torch.float32).to("neuron")
    mask = big_mask[..., :length]
    q = rand(batch, 1, heads, 128, seed=17, dtype=dtype).transpose(1, 2)
    before = runs()
    out = F.scaled_dot_product_attention(q.to("neuron"), k, v, attn_mask=mask)
    assert runs() - before == int(NATIVE)
    check_output(out, q, k.cpu(), v.cpu(), mask.cpu())


@pytest.mark.parametrize("mask_shape", [(1, 120), (2, 4, 1, 120), (1, 4, 1, 1), (2, 1, 1, 120)])
def test_mask_broadcasts(mask_shape: tuple[int, ...]) -> None:
    q = rand(2, 4, 1, 64, seed=18)
    k, v = rand(2, 4, 120, 64, seed=19), rand(2, 4, 120, 64, seed=20)
    mask = rand(*mask_shape, seed=21)
    before = runs()
    out = F.scaled_dot_product_attention(*dev(q, k, v), attn_mask=dev(mask)[0])
    assert runs() - before == int(NATIVE)
    check_output(out, q, k, v, mask)


def test_one_kv_head_splits_rows_across_threads() -> None:
    # batch 1 with one kv head: fewer groups than threads, so the group's rows are split.
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        q = rand(1, 8, 4, 64, seed=22)
        k, v = rand(1, 1, 600, 64, seed=23), rand(1, 1, 600, 64, seed=24)
        before = runs()
        with torch.no_grad():  # several float32 rows: native only where no backward follows
            out = F.scaled_dot_product_attention(*dev(q, k, v), enable_gqa=True)
        assert runs() - before == int(NATIVE)
        check_output(out, q, k, v, enable_gqa=True)
    finally:
        torch.set_num_threads(threads)


def test_native_kernels_get_the_intra_op_threads() -> None:
    # at::parallel_for in our library must fan out (it needs the build's -fopenmp).
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert torchneuron._C._intra_op_threads_used() == 2
        torch.set_num_threads(1)
        assert torchneuron._C._intra_op_threads_used() == 1
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("case", ["long_query", "causal", "float16", "float64"])
def test_fallbacks_run_the_cpu_kernel(case: str) -> None:
    dtype = {"float16": torch.float16, "float64": torch.float64}.get(case, torch.float32)
    rows = 9 if case == "long_query" else 4
    q = rand(2, 4, rows, 64, seed=25, dtype=dtype)
    k, v = rand(2, 4, 30, 64, seed=26, dtype=dtype), rand(2, 4, 30, 64, seed=27, dtype=dtype)
    causal = case == "causal"
    expected = FLASH(q, k, v, is_causal=causal)
    before = runs()
    out, lse = FLASH(*dev(q, k, v), is_causal=causal)
    assert runs() == before
    assert torch.equal(out.cpu(), expected[0]) and torch.equal(lse.cpu(), expected[1])


def test_fallback_errors_are_the_cpu_kernels() -> None:
    q, k, v = rand(1, 2, 1, 64, seed=28), rand(1, 2, 8, 64, seed=29), rand(1, 2, 8, 64, seed=30)
    with pytest.raises(RuntimeError, match="do not support dropout > 0"):
        FLASH(*dev(q, k, v), dropout_p=0.5)
    with pytest.raises(RuntimeError, match="Attention mask is the same data type as query"):
        FLASH(*dev(q, k, v), attn_mask=torch.zeros(1, 8, dtype=torch.bfloat16, device="neuron"))
    with pytest.raises(RuntimeError, match="Attention mask dim in"):
        FLASH(*dev(q, k, v), attn_mask=torch.zeros(2, 1, 8, device="neuron"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_through_the_native_forward(dtype: torch.dtype) -> None:
    q = rand(2, 4, 1, 64, seed=31, dtype=dtype)
    k, v = rand(2, 4, 70, 64, seed=32, dtype=dtype), rand(2, 4, 70, 64, seed=33, dtype=dtype)
    grad = rand(2, 4, 1, 64, seed=34, dtype=dtype)
    cpu_leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    dev_leaves = [t.to("neuron").requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*cpu_leaves).backward(grad)
    before = runs()
    F.scaled_dot_product_attention(*dev_leaves).backward(grad.to("neuron"))
    assert runs() - before == int(NATIVE)
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2**-6, "atol": 2e-2}
    for cpu_leaf, dev_leaf in zip(cpu_leaves, dev_leaves, strict=True):
        torch.testing.assert_close(dev_leaf.grad.cpu(), cpu_leaf.grad, **tol)


@pytest.mark.host_isa_only
def test_off_switch_restores_the_cpu_kernel() -> None:
    """The native kernel at each ISA level is this file's other tests, which scripts/test.sh
    runs under every cap the host allows; here, the switch that turns it off."""
    result = run_python(
        """
        import torch, torchneuron, torch.nn.functional as F
        g = torch.Generator().manual_seed(35)
        for dtype in (torch.float32, torch.bfloat16):
            for dim in (64, 128, 40):
                q = torch.randn(2, 8, 1, dim, generator=g).to(dtype)
                k = torch.randn(2, 2, 257, dim, generator=g).to(dtype)
                v = torch.randn(2, 2, 257, dim, generator=g).to(dtype)
                mask = torch.zeros(2, 1, 1, 257)
                mask[1, ..., 190:] = float("-inf")
                mask = mask.to(dtype)
                dev = [t.to("neuron") for t in (q, k, v, mask)]
                got = F.scaled_dot_product_attention(*dev[:3], attn_mask=dev[3], enable_gqa=True)
                cpu = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
                assert torch.equal(got.cpu(), cpu)
        runs = torchneuron._C._native_kernel_runs()
        print("RUNS", runs.get("aten::_scaled_dot_product_flash_attention_for_cpu", 0))
        """,
        env={"TORCHNEURON_NATIVE_KERNELS": "0"},
    )
    assert result.returncode == 0, describe(result)
    assert "RUNS 0" in result.stdout, describe(result)


def test_several_float32_rows_keep_the_cpu_kernel_when_a_backward_may_follow() -> None:
    # Grad mode on: the CPU kernel (its backward then gets the CPU's own logsumexp);
    # launched asynchronously, the worker sees the caller's grad mode.
    q, k, v = rand(2, 4, 3, 8, seed=40), rand(2, 4, 6, 8, seed=41), rand(2, 4, 6, 8, seed=42)
    before = runs()
    out, lse = FLASH(*dev(q, k, v))
    expected_out, expected_lse = FLASH(q, k, v)
    assert runs() == before
    assert torch.equal(out.cpu(), expected_out) and torch.equal(lse.cpu(), expected_lse)


def test_hugging_face_static_cache_generation_matches_cpu() -> None:
    # A tiny Llama (4 query heads, 2 kv heads, head_dim 16) decoding with a static cache,
    # eager, batch 2 with left padding: the same tokens as on the CPU, decode steps native.
    model = tiny_llama(hidden_size=64, intermediate_size=128).eval()
    ids = torch.randint(3, 64, (2, 7), generator=torch.Generator().manual_seed(36))
    mask = torch.ones_like(ids)
    ids[1, :3] = 0
    mask[1, :3] = 0
    kwargs = {
        "max_new_tokens": 8,
        "min_new_tokens": 8,
        "do_sample": False,
        "cache_implementation": "static",
        "disable_compile": True,
    }
    with torch.no_grad():
        expected = model.generate(ids, attention_mask=mask, **kwargs)
        model.to("neuron")
        before = runs()
        got = model.generate(ids.to("neuron"), attention_mask=mask.to("neuron"), **kwargs)
    assert got.cpu().tolist() == expected.tolist()
    # 7 decode steps × 2 layers took the native kernel (the prefill step did not: 7 rows
    # would qualify, so only count a lower bound)
    assert runs() - before >= 14 * int(NATIVE)


# --- compiled graphs (torchneuron/compile/native_attention.py) -----------------------------


@pytest.mark.host_isa_only
@pytest.mark.parametrize("dtype", DTYPES)
def test_compiled_decode_attention_runs_the_native_kernel(dtype: torch.dtype) -> None:
    # backend="neuron" graphs run on host aliases; their CPU flash attention node becomes
    # torchneuron::native_sdpa_decode, which counts as a native run (the CPU kernel does not).
    torch._dynamo.reset()
    q, k = rand(2, 4, 1, 16, seed=50, dtype=dtype), rand(2, 4, 20, 16, seed=51, dtype=dtype)
    v = rand(2, 4, 20, 16, seed=52, dtype=dtype)
    mask = cache_mask(2, 20, [13, 20], dtype)

    def attend(q, k, v, mask):  # noqa: ANN001, ANN202
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask) * 2

    compiled = torch.compile(attend, backend="neuron")
    compiled(*dev(q, k, v, mask))  # compiles
    before = runs()
    got = compiled(*dev(q, k, v, mask))
    assert runs() - before == int(NATIVE)
    check_output(got / 2, q, k, v, mask)


@pytest.mark.host_isa_only
def test_compiled_float32_rows_feeding_a_backward_keep_the_cpu_kernel() -> None:
    # Several float32 query rows whose logsumexp a backward reads: left to the CPU kernel, as
    # in eager; gradients match the CPU's.
    torch._dynamo.reset()
    q, k, v = rand(2, 4, 3, 8, seed=53), rand(2, 4, 6, 8, seed=54), rand(2, 4, 6, 8, seed=55)

    def loss(q, k, v):  # noqa: ANN001, ANN202
        return F.scaled_dot_product_attention(q, k, v).square().sum()

    grads = []
    for device, fn in (("cpu", loss), ("neuron", torch.compile(loss, backend="neuron"))):
        inputs = [t.detach().to(device).requires_grad_() for t in (q, k, v)]
        before = runs()
        fn(*inputs).backward()
        if device == "neuron":
            assert runs() == before
        grads.append([t.grad.cpu() for t in inputs])
    for got, want in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.host_isa_only
def test_compiled_static_cache_generation_matches_cpu() -> None:
    # What Transformers does by default on neuron with a static cache: it compiles the decode
    # step (backend "neuron"). The same tokens as CPU eager; the compiled decode steps' attention
    # took the native kernel.
    torch._dynamo.reset()
    model = tiny_llama(hidden_size=64, intermediate_size=128).eval()
    ids = torch.randint(3, 64, (1, 7), generator=torch.Generator().manual_seed(56))
    kwargs = {
        "max_new_tokens": 8,
        "min_new_tokens": 8,
        "do_sample": False,
        "cache_implementation": "static",
    }
    with torch.no_grad():
        expected = model.generate(ids, disable_compile=True, **kwargs)
        model.to("neuron")
        before = runs()
        got = model.generate(ids.to("neuron"), **kwargs)
    assert got.cpu().tolist() == expected.tolist()
    assert runs() - before >= 14 * int(NATIVE)  # 7 decode steps × 2 layers
