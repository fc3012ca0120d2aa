"""Native row kernels on neuron (csrc/kernels/row_kernels.h via
csrc/aten/native/native_row_ops.cpp).

softmax, log_softmax and their backward, and silu and its backward, run our own kernels for
contiguous float32/bfloat16 tensors reduced over the last dimension, except bfloat16
log_softmax (the CPU's kernel rounds its intermediates to bfloat16, and the module
conformance sweep holds neuron to it); everything else runs PyTorch's CPU kernel. Each test
compares with the CPU result.

Tolerances come from the kernels' error bounds, per element. In float32, exp is within
about 1 ulp (2 units u = 2**-24 of rounding, csrc/kernels/vec_exp.h); a sum of n terms
accumulated in L lanes and then across them is within (n/L + log2 L + 1) u of the exact sum,
relative to the sum of the terms' magnitudes. Our kernels accumulate in the level's lanes
(4 at the baseline level, 8 at AVX2, 16 at AVX-512) and the CPU's in at least 8, so the
difference of the two results is bounded by both bounds added (sum_bound below): relative
for softmax, absolute for log_softmax (an error in log(sum) adds to every element), and
scaled by the terms for the backward, whose differences cancel. bfloat16 results may differ
from the CPU's by one bfloat16 rounding step of the float32 result: rtol 2**-7 (two
half-ulps), atol 1e-3 for probabilities near 0.
Fallback cases run the CPU kernel itself and must be bitwise equal.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import describe, start_all

import torchneuron

TOLERANCE = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-6},  # elementwise kernels (SiLU): a few ulps
    torch.bfloat16: {"rtol": 2**-7, "atol": 1e-3},
}
DTYPES = [torch.float32, torch.bfloat16]


def runs() -> dict[str, int]:
    return dict(torchneuron._C._native_kernel_runs())


def ran(before: dict[str, int], op: str) -> int:
    return runs().get(op, 0) - before.get(op, 0)


NATIVE = bool(torchneuron._C._native_kernels_enabled())
UNIT = 2.0**-24  # float32 rounding
OUR_LANES = {"scalar": 4, "avx2": 8}.get(torchneuron._C._kernel_isa()["isa"], 16)
CPU_LANES = 8  # the fewest PyTorch's vectorised CPU kernels use on x86-64
SMALLEST_NORMAL = 2.0**-126  # our exp flushes what would be subnormal to 0


def sum_bound(n: int) -> float:
    """Relative bound of the difference between our sum of n terms and the CPU's."""

    def one(lanes: int) -> float:
        return (-(-n // lanes) + lanes.bit_length() - 1 + 1) * UNIT

    return one(OUR_LANES) + one(CPU_LANES)


def assert_within(got: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor) -> None:
    error = (got.double() - expected.double()).abs()
    finite = torch.isfinite(expected)
    assert torch.equal(got[~finite], expected[~finite])
    excess = (error - bound.double())[finite]
    if excess.numel() and excess.max() > 0:
        worst = int(excess.argmax())
        raise AssertionError(
            f"{int((excess > 0).sum())} elements beyond the bound; worst: error "
            f"{error[finite][worst].item():.3g}, bound {bound.double()[finite][worst].item():.3g}"
        )


def assert_forward_within_bound(got: torch.Tensor, expected: torch.Tensor, log: bool) -> None:
    gamma = sum_bound(expected.shape[-1])
    if log:  # log(sum) is off by the sum's relative error; each element by its own rounding
        bound = (gamma + 4 * UNIT) + 2 * UNIT * expected.abs()
    else:  # exp (2u), the sum, the division (1u), relative to the element
        bound = (gamma + 6 * UNIT) * expected.abs() + SMALLEST_NORMAL
    assert_within(got, expected, bound)


def assert_backward_within_bound(
    got: torch.Tensor, expected: torch.Tensor, grad: torch.Tensor, y: torch.Tensor, log: bool
) -> None:
    gamma = sum_bound(y.shape[-1])
    if log:  # g - exp(y) * sum(g)
        p = y.exp()
        total = grad.sum(-1, keepdim=True)
        bound = p * gamma * grad.abs().sum(-1, keepdim=True) + 6 * UNIT * (
            grad.abs() + p * total.abs()
        )
    else:  # y * (g - sum(g * y))
        total = (grad * y).sum(-1, keepdim=True)
        bound = y.abs() * (
            gamma * (grad * y).abs().sum(-1, keepdim=True) + 4 * UNIT * (grad.abs() + total.abs())
        )
    assert_within(got, expected, bound + SMALLEST_NORMAL)


def logits(shape: tuple[int, ...], dtype: torch.dtype, masked: bool = True) -> torch.Tensor:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 4
    if masked and shape[-1] > 2:
        x[..., 1] = float("-inf")  # masked entries must come out exactly 0 / -inf
    return x.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 1), (3, 17), (2, 3, 100), (64, 8000)])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_forward_matches_cpu(dtype: torch.dtype, shape: tuple[int, ...], log: bool) -> None:
    fn = torch.log_softmax if log else torch.softmax
    x = logits(shape, dtype)
    before = runs()
    y_cpu, y_dev = fn(x, -1), fn(x.to("neuron"), -1).cpu()
    cpu_kernel = log and dtype == torch.bfloat16  # the CPU's rounding, bit for bit
    expected_runs = 0 if cpu_kernel else int(NATIVE)
    assert ran(before, "aten::_log_softmax" if log else "aten::_softmax") == expected_runs
    if cpu_kernel or not NATIVE:
        assert torch.equal(y_dev, y_cpu)
    elif dtype == torch.float32:
        assert_forward_within_bound(y_dev, y_cpu, log)
    else:
        torch.testing.assert_close(y_dev, y_cpu, **TOLERANCE[dtype])
    if shape[-1] > 2:  # the masked column: exactly 0 (softmax) or -inf (log_softmax)
        assert torch.equal(y_dev[..., 1], y_cpu[..., 1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 1), (3, 17), (2, 3, 100), (64, 8000)])
@pytest.mark.parametrize("log", [False, True], ids=["softmax", "log_softmax"])
def test_backward_matches_cpu(dtype: torch.dtype, shape: tuple[int, ...], log: bool) -> None:
    # The backward kernel from the same forward output and gradient on both devices.
    x = logits(shape, dtype, masked=False)
    y = (torch.log_softmax if log else torch.softmax)(x, -1)
    grad = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    name = "_log_softmax_backward_data" if log else "_softmax_backward_data"
    op = getattr(torch.ops.aten, name)
    before = runs()
    expected = op(grad, y, y.dim() - 1, dtype)
    got = op(grad.to("neuron"), y.to("neuron"), -1, dtype).cpu()
    cpu_kernel = log and dtype == torch.bfloat16  # the CPU's rounding, bit for bit
    assert ran(before, "aten::" + name) == (0 if cpu_kernel else int(NATIVE))
    if cpu_kernel or not NATIVE:
        assert torch.equal(got, expected)
    elif dtype == torch.float32:
        assert_backward_within_bound(got, expected, grad, y, log)
    else:
        # g - exp(y) * sum(g) and y * (g - sum(g * y)) cancel: the error scales with the
        # terms (|g| and the row sum), not with the result.
        terms = grad.float().abs().amax() + grad.float().abs().sum(-1).amax()
        torch.testing.assert_close(got, expected, rtol=2**-7, atol=2**-8 * terms.item())


def test_autograd_reaches_the_native_backward() -> None:
    x = logits((4, 50), torch.float32)
    x_cpu, x_dev = x.clone().requires_grad_(), x.to("neuron").requires_grad_()
    before = runs()
    torch.softmax(x_cpu, -1).pow(2).sum().backward()
    torch.softmax(x_dev, -1).pow(2).sum().backward()
    assert ran(before, "aten::_softmax_backward_data") == int(NATIVE)
    torch.testing.assert_close(x_dev.grad.cpu(), x_cpu.grad, **TOLERANCE[torch.float32])


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_forward_and_backward_match_cpu(dtype: torch.dtype) -> None:
    x = (torch.randn(4, 1000, generator=torch.Generator().manual_seed(2)) * 8).to(dtype)
    x[0, :3] = torch.tensor([-200.0, 0.0, 200.0])
    grad = torch.randn(4, 1000, generator=torch.Generator().manual_seed(3)).to(dtype)
    x_cpu = x.clone().requires_grad_()
    x_dev = x.to("neuron").requires_grad_()
    before = runs()
    y_cpu, y_dev = F.silu(x_cpu), F.silu(x_dev)
    y_cpu.backward(grad)
    y_dev.backward(grad.to("neuron"))
    assert ran(before, "aten::silu") == int(NATIVE)
    assert ran(before, "aten::silu_backward") == int(NATIVE)
    torch.testing.assert_close(y_dev.cpu(), y_cpu.detach(), **TOLERANCE[dtype])
    torch.testing.assert_close(x_dev.grad.cpu(), x_cpu.grad, **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_cross_entropy_loss_and_gradient_match_cpu(dtype: torch.dtype) -> None:
    # A language model's loss: log_softmax + nll_loss over the vocabulary, ignored labels.
    x = logits((48, 999), dtype, masked=False)
    labels = torch.randint(0, 999, (48,), generator=torch.Generator().manual_seed(4))
    labels[:5] = -100
    x_cpu = x.clone().requires_grad_()
    x_dev = x.to("neuron").requires_grad_()
    loss_cpu = F.cross_entropy(x_cpu.float(), labels)
    loss_dev = F.cross_entropy(x_dev.float(), labels.to("neuron"))
    loss_cpu.backward()
    loss_dev.backward()
    torch.testing.assert_close(loss_dev.cpu(), loss_cpu, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(x_dev.grad.cpu(), x_cpu.grad, **TOLERANCE[dtype])


@pytest.mark.parametrize(
    "case",
    ["dim0", "transposed", "float64", "half_to_float_dtype", "empty"],
)
def test_cases_without_a_native_kernel_run_the_cpu_kernel(case: str) -> None:
    x = torch.randn(6, 10, generator=torch.Generator().manual_seed(5))
    dim = -1
    if case == "dim0":
        dim = 0
    elif case == "transposed":
        x = x.t()
    elif case == "float64":
        x = x.double()
    elif case == "empty":
        x = x[:0]
    x_dev = x.to("neuron")
    if case == "transposed":
        x_dev = x.t().contiguous().to("neuron").t()
    before = runs()
    if case == "half_to_float_dtype":
        # softmax(bf16, dtype=float32): the CPU kernel's conversion, not ours.
        xb = x.bfloat16()
        out_cpu = torch.softmax(xb, -1, dtype=torch.float32)
        out_dev = torch.softmax(xb.to("neuron"), -1, dtype=torch.float32)
    else:
        out_cpu = torch.log_softmax(x, dim)
        out_dev = torch.log_softmax(x_dev, dim)
    if case == "half_to_float_dtype":
        # Converted first, then the float32 softmax runs natively: float32 rounding.
        torch.testing.assert_close(out_dev.cpu(), out_cpu, **TOLERANCE[torch.float32])
    else:
        assert torch.equal(out_dev.cpu(), out_cpu)
    expected = int(NATIVE) if case == "half_to_float_dtype" else 0
    assert ran(before, "aten::_log_softmax") + ran(before, "aten::_softmax") == expected


def test_noncontiguous_silu_runs_the_cpu_kernel() -> None:
    x = torch.randn(8, 6, generator=torch.Generator().manual_seed(6))
    before = runs()
    out = F.silu(x.to("neuron").t())
    assert torch.equal(out.cpu(), F.silu(x.t()))
    assert ran(before, "aten::silu") == 0


@pytest.mark.host_isa_only
def test_off_switch_and_a_bad_value() -> None:
    """The native kernels at each ISA level are this file's other tests, which scripts/test.sh
    runs under every cap the host allows; here, the switch that turns them off."""
    code = """
        import torch, torchneuron, torch.nn.functional as F
        x = (torch.randn(33, 1001, generator=torch.Generator().manual_seed(7)) * 5)
        for dtype in (torch.float32, torch.bfloat16):
            xd = x.to(dtype)
            for fn in (torch.softmax, torch.log_softmax, F.silu):
                args = () if fn is F.silu else (-1,)
                assert torch.equal(fn(xd.to("neuron"), *args).cpu(), fn(xd, *args)), fn
        print("RUNS", {k: v for k, v in sorted(torchneuron._C._native_kernel_runs().items()) if v})
    """
    pending = start_all(
        {
            "off": (code, {"TORCHNEURON_NATIVE_KERNELS": "0"}),
            "bad": (code, {"TORCHNEURON_NATIVE_KERNELS": "yes"}),
        }
    )
    off = pending["off"].result()
    assert off.returncode == 0, describe(off)
    assert "RUNS {}" in off.stdout, describe(off)
    bad = pending["bad"].result()
    assert bad.returncode != 0
    assert "TORCHNEURON_NATIVE_KERNELS='yes' is not valid" in bad.stderr, describe(bad)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_op_forward_and_backward_match_eager(dtype: torch.dtype) -> None:
    # torchneuron::silu_mul against silu(a) * b on the CPU; its backward through autograd.
    from torchneuron.compile.rewrites import _register_autograd

    _register_autograd()
    a = (torch.randn(8, 300, generator=torch.Generator().manual_seed(8)) * 4).to(dtype)
    b = torch.randn(8, 300, generator=torch.Generator().manual_seed(9)).to(dtype)
    grad = torch.randn(8, 300, generator=torch.Generator().manual_seed(10)).to(dtype)
    a_cpu, b_cpu = a.clone().requires_grad_(), b.clone().requires_grad_()
    a_dev, b_dev = a.to("neuron").requires_grad_(), b.to("neuron").requires_grad_()
    before = runs()
    (F.silu(a_cpu) * b_cpu).backward(grad)
    out = torch.ops.torchneuron.silu_mul(a_dev, b_dev)
    out.backward(grad.to("neuron"))
    assert ran(before, "torchneuron::silu_mul") == int(NATIVE)
    assert ran(before, "torchneuron::silu_mul_backward") == int(NATIVE)
    expected = (F.silu(a) * b).to(dtype)
    torch.testing.assert_close(out.detach().cpu(), expected, **TOLERANCE[dtype])
    torch.testing.assert_close(a_dev.grad.cpu(), a_cpu.grad, **TOLERANCE[dtype])
    torch.testing.assert_close(b_dev.grad.cpu(), b_cpu.grad, **TOLERANCE[dtype])
    # Shapes the kernel does not take (broadcasting) compute the same thing with aten ops.
    row = b[:1].to("neuron")
    torch.testing.assert_close(
        torch.ops.torchneuron.silu_mul(a.to("neuron"), row).cpu(),
        F.silu(a) * b[:1],
        **TOLERANCE[dtype],
    )


def _gated_graph() -> torch.fx.GraphModule:
    # The graph Dynamo captures for LlamaMLP's act_fn(gate) * up, with its example values.
    def gated(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.silu(a) * b

    gm = torch.fx.symbolic_trace(gated)
    example = torch.randn(4, 8)
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "call_function"):
            node.meta["example_value"] = example
    return gm


def test_rewrite_is_opt_in_and_replaces_silu_times_up(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchneuron.compile.rewrites import rewrite_silu_mul

    a, b = torch.randn(4, 8), torch.randn(4, 8)
    monkeypatch.delenv("TORCHNEURON_COMPILE_REWRITES", raising=False)
    gm = _gated_graph()
    assert rewrite_silu_mul(gm) == 0
    monkeypatch.setenv("TORCHNEURON_COMPILE_REWRITES", "1")
    assert rewrite_silu_mul(gm) == int(NATIVE)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    if NATIVE:
        assert targets == [torch.ops.torchneuron.silu_mul.default]
    torch.testing.assert_close(gm(a, b), F.silu(a) * b, rtol=1e-5, atol=1e-6)
    monkeypatch.setenv("TORCHNEURON_COMPILE_REWRITES", "yes")
    with pytest.raises(ValueError, match="TORCHNEURON_COMPILE_REWRITES='yes' is not valid"):
        rewrite_silu_mul(_gated_graph())


@pytest.mark.host_isa_only
def test_compiled_gated_mlp_rewrite_is_applied_and_matches_cpu() -> None:
    # torch.compile(backend="neuron") with TORCHNEURON_COMPILE_REWRITES=1: a Llama MLP's
    # silu(gate) * up becomes torchneuron::silu_mul in forward and backward; results match
    # the CPU's eager model within float32 tolerance.
    code = """
        import torch, torchneuron
        from torchneuron.compile.rewrites import rewrite_counters
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaMLP
        torch.manual_seed(0)
        cpu = LlamaMLP(LlamaConfig(hidden_size=64, intermediate_size=128))
        dev = LlamaMLP(LlamaConfig(hidden_size=64, intermediate_size=128)).to("neuron")
        dev.load_state_dict(cpu.state_dict())
        x = torch.randn(3, 5, 64)
        xc, xd = x.clone().requires_grad_(), x.to("neuron").requires_grad_()
        yd = torch.compile(dev, backend="neuron")(xd)
        yd.sum().backward()
        yc = cpu(xc)
        yc.sum().backward()
        tol = dict(rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(yd.detach().cpu(), yc.detach(), **tol)
        torch.testing.assert_close(xd.grad.cpu(), xc.grad, **tol)
        grad_dev, grad_cpu = dev.gate_proj.weight.grad, cpu.gate_proj.weight.grad
        torch.testing.assert_close(grad_dev.cpu(), grad_cpu, **tol)
        runs = torchneuron._C._native_kernel_runs()
        print("REWRITES", rewrite_counters()["silu_mul"])
        forward = runs.get("torchneuron::silu_mul", 0)
        print("RUNS", forward, runs.get("torchneuron::silu_mul_backward", 0))
    """
    result = start_all({"on": (code, {"TORCHNEURON_COMPILE_REWRITES": "1"})})["on"].result()
    assert result.returncode == 0, describe(result)
    assert "REWRITES 1" in result.stdout, describe(result)
    assert "RUNS 1 1" in result.stdout, describe(result)
