"""The float32 product route (csrc/aten/native/gemm_route.h): the native GEMM or PyTorch's CPU
library kernel, timed once per shape class, or pinned by TORCHNEURON_GEMM_ROUTE.

References: the CPU's product on the same inputs (float32 tolerance of test_native_gemm.py),
and for the library route PyTorch's own kernel run as the route runs it (each half of the
output rows a one-thread product), which it must equal bit for bit.
"""

from __future__ import annotations

import pytest
import torch
from conftest import describe, run_python

from torchneuron.compile.native_gemm import native_gemm_calls, native_kernels_enabled

DEV = "neuron"
# 512x512x512: 2^27 multiply-adds, above the routed bound (2^24) and the shared-product bound.
M = N = K = 512


def routes() -> list[str]:
    return list(torch.ops.torchneuron.gemm_routes())


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-6 * K)


def test_measured_class_keeps_one_route_and_cpu_results() -> None:
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    bias = torch.randn(N, generator=g)
    ad, bd = a.to(DEV), b.to(DEV)
    before = native_gemm_calls()
    # Twelve products of one class, each reading `a` as the in-place op before it left it.
    got, want = [], []
    for step in range(12):
        if step % 2:
            got.append(torch.addmm(bias.to(DEV), ad, bd, beta=0.5, alpha=2.0))
            want.append(torch.addmm(bias, a, b, beta=0.5, alpha=2.0))
        else:
            got.append(ad @ bd)
            want.append(a @ b)
        ad.mul_(-0.75)
        a.mul_(-0.75)
    native = native_gemm_calls() - before
    for got_step, want_step in zip(got, want, strict=True):
        close(got_step, want_step)
    if not native_kernels_enabled():
        assert native == 0 and not routes()
        return
    decided = [line for line in routes() if line.startswith(f"{M},{N},{K},n,n:")]
    assert len(decided) == 1, routes()  # measured once, at the class's first product
    route = decided[0].split(":")[1]
    assert native == (12 if route == "native" else 0), (decided, native)
    native_s, library_s = (float(s) for s in decided[0].split(":")[2].split(","))
    assert route == ("library" if library_s < native_s else "native")


def test_small_products_are_not_measured() -> None:
    a = torch.randn(64, 256)
    before = set(routes())
    got = a.to(DEV) @ a.t().to(DEV)  # 64x64x256: below the routed bound
    close(got, a @ a.t())
    assert set(routes()) == before


PINNED = """
import torch, torchneuron
from torchneuron.compile.native_gemm import native_gemm_calls
g = torch.Generator().manual_seed(5)
a, b = torch.randn(512, 512, generator=g), torch.randn(512, 512, generator=g)
bias = torch.randn(512, generator=g)

def halves(f):  # PyTorch's kernel as the library route runs it: two one-thread row halves
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return torch.cat([f(0, 256), f(256, 512)])
    finally:
        torch.set_num_threads(threads)

ad, bd = a.to("neuron"), b.to("neuron")
before = native_gemm_calls()
got, want, library = [], [], []
for step in range(8):
    odd = step % 2
    got.append(torch.addmm(bias.to("neuron"), ad, bd, beta=0.5, alpha=2.0) if odd else ad @ bd)
    aa = a.clone()
    if step % 2:
        want.append(torch.addmm(bias, a, b, beta=0.5, alpha=2.0))
        library.append(halves(lambda i, j: torch.addmm(bias, aa[i:j], b, beta=0.5, alpha=2.0)))
    else:
        want.append(a @ b)
        library.append(halves(lambda i, j: aa[i:j] @ b))
    ad.mul_(-0.75)
    a.mul_(-0.75)
with torch.inference_mode():  # inference tensors, written by whichever thread helps
    inferred = [torch.addmm(bias.to("neuron"), ad, bd) for _ in range(8)]
torch.neuron.synchronize()  # the caller helps outside the mode
assert all(torch.equal(t.cpu(), inferred[0].cpu()) for t in inferred)
torch.testing.assert_close(inferred[0].cpu(), torch.addmm(bias, a, b), rtol=1e-5, atol=5e-4)
compiled = torch.compile(lambda x, y: torch.relu(x @ y), backend="neuron")
got_compiled = compiled(a.to("neuron"), b.to("neuron")).cpu()
torch.testing.assert_close(got_compiled, torch.relu(a @ b), rtol=1e-5, atol=5e-4)
for got_step, want_step in zip(got, want):
    torch.testing.assert_close(got_step.cpu(), want_step, rtol=1e-5, atol=5e-4)
print("library_bitwise", all(torch.equal(x.cpu(), y) for x, y in zip(got, library)))
relu_halves = halves(lambda i, j: torch.relu(a[i:j] @ b))
print("compiled_library_bitwise", torch.equal(got_compiled, relu_halves))
print("native_calls", native_gemm_calls() - before)
print("routes", torch.ops.torchneuron.gemm_routes())
"""


@pytest.mark.host_isa_only
@pytest.mark.launch_mode_independent
@pytest.mark.parametrize("launch", ["async", "blocking"])
def test_pinned_library_route_is_pytorchs_kernel_in_row_halves(launch: str) -> None:
    env = {"TORCHNEURON_GEMM_ROUTE": "library"}
    if launch == "blocking":
        env["NEURON_LAUNCH_BLOCKING"] = "1"
    result = run_python(PINNED, env=env)
    assert result.returncode == 0, describe(result)
    assert "library_bitwise True" in result.stdout, describe(result)
    assert "compiled_library_bitwise True" in result.stdout, describe(result)
    assert "native_calls 0" in result.stdout, describe(result)
    assert "routes []" in result.stdout, describe(result)  # pinned: nothing measured


@pytest.mark.host_isa_only
@pytest.mark.launch_mode_independent
def test_pinned_native_route_takes_the_native_gemm() -> None:
    result = run_python(PINNED, env={"TORCHNEURON_GEMM_ROUTE": "native"})
    assert result.returncode == 0, describe(result)
    # 8 eager products, 8 under inference mode, 1 compiled
    assert "native_calls 17" in result.stdout, describe(result)
    assert "routes []" in result.stdout, describe(result)


@pytest.mark.host_isa_only
@pytest.mark.launch_mode_independent
def test_invalid_route_is_refused_with_the_choices() -> None:
    result = run_python(
        """
        import torch, torchneuron
        a = torch.randn(512, 512, device="neuron")
        (a @ a).cpu()
        """,
        env={"TORCHNEURON_GEMM_ROUTE": "fastest"},
    )
    assert result.returncode != 0
    assert "TORCHNEURON_GEMM_ROUTE='fastest' is not valid" in result.stderr, describe(result)
    assert "measure" in result.stderr and "library" in result.stderr
