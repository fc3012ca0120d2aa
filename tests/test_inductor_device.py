"""Plain ``torch.compile`` (Inductor) on neuron tensors with launched work
(torchneuron/compile/inductor_device.py).

Inductor's wrapper calls neuron ops (extern products, fallbacks), which launch on the
stream's worker and return at once, and its own C++ kernels, which read and write device
memory on the calling thread. The products here are 1536 wide: tens of milliseconds on the
worker, so a C++ kernel that did not wait for them would read unwritten memory in every
call (as it did before the wrapper waited). References: the same functions run eagerly on
the CPU. Tolerances: float32 products of different blockings, within rtol 1e-4 and atol
1e-3 (sums of 1536 unit-variance terms reach |100|, where rounding differences accumulate
to ~1e-4); gradients scaled down to order 1 use atol 1e-4.
"""

from __future__ import annotations

import pytest
import torch

DEV = "neuron"
BIG = 1536
TOL = {"rtol": 1e-4, "atol": 1e-3}


def _inputs(*shapes: tuple[int, ...]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(*shape, generator=g) for shape in shapes]


def _launched(t: torch.Tensor) -> torch.Tensor:
    """`t` on the device as the result of an op that may still be running on the worker."""
    return t.to(DEV) * 1.0


def test_host_kernels_read_products_after_the_stream_wrote_them() -> None:
    def f(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ w + b).sum(dim=1) * 2

    x, w, b = _inputs((BIG, BIG), (BIG, BIG), (BIG,))
    expected = f(x, w, b)
    compiled = torch.compile(f)
    wd, bd = w.to(DEV), b.to(DEV)
    for _ in range(3):
        got = compiled(_launched(x), wd, bd)
        assert got.device.type == DEV
        torch.testing.assert_close(got.cpu(), expected, **TOL)


def test_a_kernel_writing_an_input_waits_for_the_product_reading_it() -> None:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        y = x @ w
        x.mul_(-1.0)  # written by a C++ kernel after the product, which reads x, launched
        return y

    x, w = _inputs((BIG, BIG), (BIG, BIG))
    expected = f(x.clone(), w)
    compiled = torch.compile(f)
    xd, wd = x.to(DEV), w.to(DEV)
    got = compiled(xd, wd)
    torch.testing.assert_close(got.cpu(), expected, **TOL)
    torch.testing.assert_close(xd.cpu(), -x, rtol=0, atol=0)


def test_training_step_gradients_match_the_cpu() -> None:
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(
        torch.nn.Linear(BIG, BIG), torch.nn.GELU(), torch.nn.Linear(BIG, 64), torch.nn.Tanh()
    )
    dev = torch.nn.Sequential(
        torch.nn.Linear(BIG, BIG), torch.nn.GELU(), torch.nn.Linear(BIG, 64), torch.nn.Tanh()
    )
    dev.load_state_dict(cpu.state_dict())
    dev.to(DEV)
    (x,) = _inputs((512, BIG))
    cpu(x).square().mean().backward()
    torch.compile(dev)(_launched(x)).square().mean().backward()
    for p, q in zip(cpu.parameters(), dev.parameters(), strict=True):
        assert q.grad is not None and q.grad.device.type == DEV
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_control_flow_branches_compile_and_wait(sign: float) -> None:
    """torch.cond's branches are Inductor subgraphs, with their own wrapper (before the
    neuron subgraph wrapper they failed to compile: "device neuron nyi")."""

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        def positive(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return torch.relu(x @ w) + 1

        def negative(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return torch.sigmoid(x @ w) - 1

        return torch.cond(x.sum() > 0, positive, negative, (x, w))

    x, w = _inputs((BIG, BIG), (BIG, BIG))
    x = x.abs() * sign
    got = torch.compile(f)(_launched(x), w.to(DEV))
    torch.testing.assert_close(got.cpu(), f(x, w), **TOL)


def test_the_graph_cache_key_names_this_code() -> None:
    """Inductor's FX graph cache key carries a hash of the wrapper's generator, so a wrapper
    cached by another torchneuron (one without the waits, say) is never reused."""
    from torch._inductor.codecache import FxGraphHashDetails
    from torch._inductor.custom_graph_pass import get_hash_for_files

    from torchneuron.compile import inductor_aot, inductor_device

    assert inductor_device.register()
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    details = FxGraphHashDetails(gm, [torch.ones(2, device=DEV)], {}, [])
    version = get_hash_for_files((inductor_device.__file__, inductor_aot.__file__)).hex()
    assert version in details.custom_backend_passes
