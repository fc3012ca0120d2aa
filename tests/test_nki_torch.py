"""NKI kernels with numpy and neuron tensors, as torch custom ops (eager, autograd,
torch.compile), and the opt-in import aliases."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import support.nki_sample_kernels as k
import torch

import torchneuron.nki as nki
import torchneuron.nki.language as nl


def test_numpy_in_numpy_out():
    a = np.arange(128 * 512, dtype=np.float32).reshape(128, 512)
    out = k.tensor_add(a, a)
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, 2 * a)


def test_neuron_tensors_in_neuron_tensors_out_with_a_non_contiguous_view():
    a = torch.randn(256, 1024, device="neuron")
    b = torch.randn(1024, 256, device="neuron").t()  # a transposed view
    assert not b.is_contiguous()
    out = k.tensor_add(a, b)
    assert out.device.type == "neuron"
    torch.testing.assert_close(out.cpu(), a.cpu() + b.cpu(), rtol=0, atol=0)
    out = k.tensor_add(a, b)  # compiled path: same answer
    torch.testing.assert_close(out.cpu(), a.cpu() + b.cpu(), rtol=0, atol=0)


def test_an_output_allocated_behind_launched_work_keeps_the_kernels_stores():
    """A kernel's neuron output is zero-filled on the stream and then written from this
    thread: the allocator waits for the fill. With a long product queued first, a fill that
    was not waited for would land over the stores every time (it did, before the wait)."""
    import torchneuron
    from torchneuron.nki.hbm_io import Allocator

    if torchneuron._C._launch_blocking():
        pytest.skip("NEURON_LAUNCH_BLOCKING=1: nothing is queued on the stream")
    big = torch.randn(1536, 1536, device="neuron")
    torch.neuron.synchronize()
    busy = big @ big  # tens of milliseconds on the stream worker
    assert not torch.neuron.current_stream().query()
    allocator = Allocator(torch.device("neuron", 0))
    out = allocator((256, 1024), np.dtype(np.float32))
    out[...] = 7.0  # the kernel's stores, from this thread
    tensor = allocator.result(out, np.dtype(np.float32))
    assert tensor.device.type == "neuron"
    torch.testing.assert_close(tensor.cpu(), torch.full((256, 1024), 7.0), rtol=0, atol=0)
    del busy


def test_kernel_writes_an_output_argument_in_device_memory():
    @nki.jit
    def double_into(x, out):
        nl.store(out, value=nl.multiply(nl.load(x), 2.0))

    x = torch.randn(128, 64, device="neuron")
    out = torch.zeros(128, 64, device="neuron")
    double_into(x, out)
    torch.testing.assert_close(out.cpu(), 2 * x.cpu(), rtol=0, atol=0)


def test_bfloat16_neuron_tensors():
    x = torch.randn(128, 256, dtype=torch.bfloat16, device="neuron")
    out = k.softmax_kernel(x)
    assert out.dtype == torch.bfloat16 and out.device.type == "neuron"
    torch.testing.assert_close(
        out.cpu(), torch.softmax(x.cpu().float(), -1).to(torch.bfloat16), rtol=1.6e-2, atol=4e-3
    )


@nki.jit
def _scale_rows(x: torch.Tensor, factor: float) -> torch.Tensor:
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    for t in nl.affine_range(n // 128):
        tile = nl.load(x[t * 128 : (t + 1) * 128, :])
        nl.store(out[t * 128 : (t + 1) * 128, :], value=nl.multiply(tile, factor))
    return out


_scale_op = torch.neuron.nki_op("nkitest::scale_rows", mutates_args=())(_scale_rows)


def _setup(ctx, inputs, output):
    ctx.factor = inputs[1]


def _backward(ctx, grad):
    return _scale_op(grad, ctx.factor), None


_scale_op.register_autograd(_backward, setup_context=_setup)


def test_custom_op_eager_and_autograd():
    x = torch.randn(256, 64, device="neuron", requires_grad=True)
    y = torch.ops.nkitest.scale_rows(x, 3.0)
    assert y.device.type == "neuron"
    torch.testing.assert_close(y.detach().cpu(), 3 * x.detach().cpu(), rtol=0, atol=0)
    y.sum().backward()
    torch.testing.assert_close(x.grad.cpu(), torch.full((256, 64), 3.0), rtol=0, atol=0)


def test_custom_op_compiles_without_a_graph_break():
    def f(a):
        return torch.ops.nkitest.scale_rows(a * 2, 0.5)

    a = torch.randn(256, 64, device="neuron")
    assert torch._dynamo.explain(f)(a).graph_break_count == 0
    compiled = torch.compile(f, backend="neuron", fullgraph=True)
    torch.testing.assert_close(compiled(a).cpu(), a.cpu(), rtol=0, atol=0)


def test_compiled_graph_uses_the_custom_op_result_with_its_dtype(tmp_path, monkeypatch):
    # The op's fake result once claimed bfloat16 for every tensor result, so the kernel
    # Inductor generated after it read float32 bytes as bfloat16 (wrong in ~99% of elements).
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path / "cache"))

    def f(a):
        return torch.ops.nkitest.scale_rows(a * 2, 0.5) + 1

    a = torch.randn(256, 64, device="neuron")
    compiled = torch.compile(f, backend="neuron", fullgraph=True)
    torch.testing.assert_close(compiled(a).cpu(), a.cpu() + 1, rtol=0, atol=0)


def test_custom_op_needs_annotations():
    def plain(x):
        return x

    with pytest.raises(TypeError, match="annotate every parameter"):
        torch.neuron.nki_op("nkitest::plain", plain)


def test_aliases_are_opt_in_and_never_shadow(monkeypatch):
    for name in [n for n in sys.modules if n == "nki" or n.startswith(("nki.", "neuronxcc"))]:
        monkeypatch.delitem(sys.modules, name)
    import importlib.util

    assert importlib.util.find_spec("neuronxcc") is None  # nothing installed by default
    installed = nki.install_aliases()
    try:
        import neuronxcc.nki.language as legacy_nl
        import nki.isa as new_nisa

        assert legacy_nl is nl and new_nisa is nki.isa
        assert "neuronxcc.nki" in installed and "nki" in installed
        assert nki.install_aliases() == []  # present now: nothing is replaced
    finally:
        for name in installed + [
            "neuronxcc.nki.language",
            "neuronxcc.nki.isa",
            "neuronxcc.nki.typing",
            "nki.language",
            "nki.isa",
            "nki.typing",
        ]:
            sys.modules.pop(name, None)
