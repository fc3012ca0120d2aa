"""The native GEMM (csrc/kernels/gemm.h) behind neuron mm/addmm/bmm, eager and compiled.

Results are compared with the CPU's on the same inputs. Tolerances: float32 products differ
only in summation order (rtol 1e-5, atol 1e-6·k); bfloat16 products are rounded once from a
float32 sum on both sides, so they differ by at most one bf16 ulp when the float32 sums
straddle a rounding boundary (rtol 2^-7, atol 1e-3).
"""

from __future__ import annotations

import os

import pytest
import torch
from conftest import describe, run_python

import torchneuron
from torchneuron.compile.native_gemm import (
    native_gemm_calls,
    native_gemm_preferred,
    native_kernels_enabled,
)

DEV = "neuron"
DTYPES = (torch.float32, torch.bfloat16)
# (m, n, k): decode GEMV, odd sizes, k not a multiple of any vector width, a packed GEMM
# spanning several K and N blocks, few columns (W·x: a GEMV computed transposed).
SHAPES = (
    (1, 37, 19),
    (1, 300, 770),
    (3, 5, 40),
    (8, 65, 33),
    (9, 71, 300),
    (130, 290, 270),
    (70, 3, 90),
)


def tolerances(dtype: torch.dtype, k: int) -> dict[str, float]:
    if dtype == torch.float32:
        return {"rtol": 1e-5, "atol": 1e-6 * max(k, 1)}
    return {"rtol": 2**-7, "atol": 1e-3}


def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, k: int) -> None:
    assert got.device.type == DEV and got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got.cpu(), want, **tolerances(dtype, k))


def takes(dtype: torch.dtype, rows: int, columns: int) -> int:
    """1 if a product of `rows` × `columns` outputs runs the native GEMM on this host, else 0:
    bf16 products beyond GEMV sizes go to oneDNN on hosts with native bf16 (gemm_preferred)."""
    return int(native_gemm_preferred(dtype, rows, columns))


def counted(expected_native: int):
    """Asserts the native GEMM ran `expected_native` times in the block (0 when switched off)."""

    class Count:
        def __enter__(self) -> None:
            self.before = native_gemm_calls()

        def __exit__(self, *exc: object) -> None:
            if exc[0] is None:
                want = expected_native if native_kernels_enabled() else 0
                assert native_gemm_calls() - self.before == want

    return Count()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_linear_transposes_match_cpu(dtype: torch.dtype, shape: tuple[int, int, int]) -> None:
    m, n, k = shape
    x, w, dy = torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype), torch.randn(m, n).to(dtype)
    xd, wd, dyd = x.to(DEV), w.to(DEV), dy.to(DEV)
    with counted(takes(dtype, m, n) + takes(dtype, m, k) + takes(dtype, n, k)):
        forward = xd @ wd.t()  # Y = X·Wᵀ
        grad_input = dyd @ wd  # dY·W
        grad_weight = dyd.t() @ xd  # dYᵀ·X
    close(forward, x @ w.t(), dtype, k)
    close(grad_input, dy @ w, dtype, n)
    close(grad_weight, dy.t() @ x, dtype, m)


@pytest.mark.parametrize("dtype", DTYPES)
def test_addmm_bias_forms_and_scalars(dtype: torch.dtype) -> None:
    m, n, k = 7, 45, 61
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    for bias in (torch.randn(n), torch.randn(m, n), torch.randn(m, 1), torch.randn(1, n)):
        bias = bias.to(dtype)
        for beta, alpha in ((1, 1), (0.5, -2.0), (0, 1)):
            with counted(takes(dtype, m, n)):
                got = torch.addmm(bias.to(DEV), a.to(DEV), b.to(DEV), beta=beta, alpha=alpha)
            close(got, torch.addmm(bias, a, b, beta=beta, alpha=alpha), dtype, k)
    # beta=0 ignores the bias entirely, NaNs included, as on the CPU.
    nan_bias = torch.full((n,), float("nan"), dtype=dtype)
    got = torch.addmm(nan_bias.to(DEV), a.to(DEV), b.to(DEV), beta=0)
    close(got, torch.addmm(nan_bias, a, b, beta=0), dtype, k)


@pytest.mark.parametrize("dtype", DTYPES)
def test_bmm_and_strided_views(dtype: torch.dtype) -> None:
    a, b = torch.randn(3, 17, 40).to(dtype), torch.randn(3, 33, 40).to(dtype)
    with counted(takes(dtype, 17, 33) + takes(dtype, 9, 33)):
        got = torch.bmm(a.to(DEV), b.to(DEV).transpose(1, 2))
        # A column slice: row stride wider than k.
        sliced = torch.randn(9, 80).to(dtype)
        got_slice = sliced.to(DEV)[:, 5:45] @ b[0].to(DEV).t()
    close(got, torch.bmm(a, b.transpose(1, 2)), dtype, 40)
    close(got_slice, sliced[:, 5:45] @ b[0].t(), dtype, 40)


@pytest.mark.parametrize("bias_form", ["none", "row", "full", "column"])
def test_bf16_products_left_to_onednn_keep_program_order_and_cpu_results(bias_form: str) -> None:
    # 256x512x512 bf16: on AVX512-BF16/AMX hosts oneDNN's (not gemm_preferred), its output
    # rows split over the task board so a waiting caller helps (native_gemm.cpp); elsewhere
    # the native GEMM. Twelve products, each reading x as the in-place op before it left it.
    m, k, n = 256, 512, 512
    g = torch.Generator().manual_seed(7)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    w = (torch.randn(k, n, generator=g) / 16).to(torch.bfloat16)
    shapes = {"none": None, "row": (n,), "full": (m, n), "column": (m, 1)}
    bias = None if shapes[bias_form] is None else torch.randn(*shapes[bias_form], generator=g)
    bias = None if bias is None else bias.to(torch.bfloat16)
    xd, wd = x.to(DEV), w.to(DEV)
    bd = None if bias is None else bias.to(DEV)
    got, want = [], []
    for _ in range(12):
        if bias is None:
            got.append(xd @ wd)
            want.append(x @ w)
        else:
            got.append(torch.addmm(bd, xd, wd, beta=0.5, alpha=2.0))
            want.append(torch.addmm(bias, x, w, beta=0.5, alpha=2.0))
        xd.mul_(-0.75)
        x.mul_(-0.75)
    for got_step, want_step in zip(got, want, strict=True):
        close(got_step, want_step, torch.bfloat16, k)


def test_preference_policy() -> None:
    # GEMVs (few rows or few columns) and float32 always take the native GEMM; bf16 beyond
    # GEMV sizes only on hosts without native bf16 (the policy benchmarks/gemm.py measured).
    isa = torchneuron._C._kernel_isa()["isa"]
    on = native_kernels_enabled()
    assert native_gemm_preferred(torch.float32, 4096, 4096) == on
    assert native_gemm_preferred(torch.bfloat16, 8, 4096) == on
    assert native_gemm_preferred(torch.bfloat16, 4096, 8) == on
    no_native_bf16 = isa in ("scalar", "avx2", "avx512")
    assert native_gemm_preferred(torch.bfloat16, 64, 64) == (on and no_native_bf16)
    assert not native_gemm_preferred(torch.float16, 1, 1)


def test_ops_are_counted_under_their_names() -> None:
    # Regression: one shared counter once charged every product to the first op's name.
    a = torch.randn(3, 4, device=DEV)
    torch.neuron.clear_op_tracking()
    a @ a.t()
    torch.addmm(torch.randn(3, device=DEV), a, a.t())
    torch.addmm(torch.randn(3, device=DEV), a, a.t())
    torch.bmm(a[None], a.t()[None])
    executed = torch.neuron.get_executed_ops()
    assert (executed["aten::mm"], executed["aten::addmm"], executed["aten::bmm"]) == (1, 2, 1)


def test_empty_and_zero_k() -> None:
    a, b = torch.randn(4, 0), torch.randn(0, 6)
    got = a.to(DEV) @ b.to(DEV)
    assert torch.equal(got.cpu(), torch.zeros(4, 6))
    assert (torch.randn(0, 5).to(DEV) @ torch.randn(5, 3).to(DEV)).shape == (0, 3)


def test_other_dtypes_and_errors_take_the_cpu_kernel() -> None:
    a, b = torch.randn(5, 6, dtype=torch.float64), torch.randn(6, 4, dtype=torch.float64)
    with counted(0):
        got = a.to(DEV) @ b.to(DEV)
        half = a.half().to(DEV) @ b.half().to(DEV)
    assert torch.equal(got.cpu(), a @ b)
    assert torch.equal(half.cpu(), a.half() @ b.half())
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        torch.randn(2, 3, device=DEV) @ torch.randn(4, 5, device=DEV)
    with pytest.raises(RuntimeError, match="same dtype|expected"):
        torch.mm(torch.randn(2, 3, device=DEV), torch.randn(3, 2, device=DEV).bfloat16())
    with pytest.raises(RuntimeError, match="same device"):
        torch.mm(torch.randn(2, 3, device=DEV), torch.randn(3, 2))


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_autograd_matches_cpu(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    cpu = torch.nn.Linear(48, 30).to(dtype)
    dev = torch.nn.Linear(48, 30).to(dtype).to(DEV)
    dev.load_state_dict(cpu.state_dict())
    x = torch.randn(6, 48).to(dtype)
    xc, xd = x.clone().requires_grad_(), x.to(DEV).requires_grad_()
    cpu(xc).square().sum().backward()
    dev(xd).square().sum().backward()
    tol = tolerances(dtype, 48) if dtype == torch.float32 else {"rtol": 2**-6, "atol": 2e-2}
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, **tol)
    torch.testing.assert_close(dev.weight.grad.cpu(), cpu.weight.grad, **tol)
    torch.testing.assert_close(dev.bias.grad.cpu(), cpu.bias.grad, **tol)


@pytest.mark.host_isa_only
def test_compiled_graph_calls_native_gemm() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 10))
    dev = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 10))
    dev.load_state_dict(model.state_dict())
    compiled = torch.compile(dev.to(DEV), backend="neuron")
    x = torch.randn(5, 64)
    xd = x.to(DEV).requires_grad_()
    compiled(xd)  # compile first, count the second call
    eager_before = torch.neuron.get_executed_ops()
    # Forward: 2 addmm; backward: 2 grad_weight + 2 grad_input mm.
    with counted(6):
        y = compiled(xd)
        y.sum().backward()
    eager_after = torch.neuron.get_executed_ops()
    for op in ("aten::mm", "aten::addmm"):  # the graph's matmuls did not dispatch eagerly
        assert eager_after.get(op, 0) == eager_before.get(op, 0)
    xc = x.clone().requires_grad_()
    model(xc).sum().backward()
    torch.testing.assert_close(y.detach().cpu(), model(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xd.grad.cpu(), xc.grad, rtol=1e-5, atol=1e-5)


def test_compiled_bf16_products_left_to_onednn_match_cpu() -> None:
    # 256 rows of 512 -> 512 in bf16: on AVX512-BF16/AMX hosts the graph's native_addmm and
    # native_mm hand them to oneDNN, rows split over the task board; elsewhere the native
    # GEMM. Against CPU eager's products (the module's bf16 tolerances).
    torch.manual_seed(0)
    x, y = (torch.randn(256, 512).to(torch.bfloat16) for _ in range(2))
    w1, w2 = (torch.randn(512, 512).to(torch.bfloat16) / 8 for _ in range(2))
    bias = torch.randn(512).to(torch.bfloat16)

    def two_products(x, y, w1, w2, bias):
        return torch.nn.functional.linear(x, w1, bias), y @ w2  # addmm, mm

    compiled = torch.compile(two_products, backend="neuron")
    args = [t.to(DEV) for t in (x, y, w1, w2, bias)]
    compiled(*args)  # compiles
    got = compiled(*args)
    for got_product, want in zip(got, two_products(x, y, w1, w2, bias), strict=True):
        close(got_product, want, torch.bfloat16, 512)


@pytest.mark.host_isa_only
@pytest.mark.launch_mode_independent
def test_off_switch_restores_cpu_kernels() -> None:
    result = run_python(
        """
        import torch, torchneuron
        from torchneuron.compile.native_gemm import native_gemm_calls
        a, b = torch.randn(9, 70), torch.randn(70, 33)
        got = a.to("neuron") @ b.to("neuron")
        assert torch.equal(got.cpu(), a @ b)  # the CPU's own kernel: bitwise equal
        f = torch.compile(lambda x, y: torch.relu(x @ y), backend="neuron")
        assert torch.equal(f(a.to("neuron"), b.to("neuron")).cpu(), torch.relu(a @ b))
        print("calls", native_gemm_calls())
        """,
        env={"TORCHNEURON_NATIVE_KERNELS": "0"},
    )
    assert result.returncode == 0, result.stderr
    assert "calls 0" in result.stdout


LEVELS = ["scalar", "avx2", "avx512", "avx512_bf16", "amx_bf16"]


def test_kernel_isa_is_the_host_level_capped_by_the_environment() -> None:
    """scripts/test.sh runs the kernel tests again under each lower cap: this is what makes
    those passes test the level they name."""
    isa = torchneuron._C._kernel_isa()
    cap = os.environ.get("TORCHNEURON_KERNEL_ISA") or "amx_bf16"
    expected = LEVELS[min(LEVELS.index(cap), LEVELS.index(isa["host_isa"]))]
    assert isa["isa"] == expected, isa


@pytest.mark.host_isa_only
@pytest.mark.launch_mode_independent
def test_an_unknown_isa_cap_is_an_error_naming_the_levels() -> None:
    result = run_python(
        "import torch, torchneuron; x = torch.ones(4, 4, device='neuron'); print(x @ x)",
        env={"TORCHNEURON_KERNEL_ISA": "avx9"},
    )
    assert result.returncode != 0
    message = (
        "TORCHNEURON_KERNEL_ISA='avx9' is not one of scalar, avx2, avx512, avx512_bf16, amx_bf16"
    )
    assert message in result.stderr, describe(result)
