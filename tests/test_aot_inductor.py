"""AOTInductor on neuron: torch.export → aoti_compile_and_package → aoti_load_package.

One small model (layer norm, linear, attention with a mask, a buffer, a view of an input,
a fresh allocation, a size) is exported on neuron with a dynamic sequence length and packaged once
per module (compiling C++ takes ~30 s of CPU). References: the same model run eagerly on
CPU with the same weights. Tolerances: float32 within atol 1e-5 / rtol 1e-4 (the package's
kernels may fuse and reorder float arithmetic).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import describe, run_python

TOL = {"atol": 1e-5, "rtol": 1e-4}


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.qkv = torch.nn.Linear(16, 48)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 16))

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, t, 3, 2, 8).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = y.transpose(1, 2).reshape(b, t, 16) * self.scale
        return y, x.transpose(1, 2), torch.arange(t, device=x.device) * 2, t * 3


def _inputs(length: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(length)
    return torch.randn(2, length, 16, generator=g), torch.randn(length, length, generator=g)


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> tuple[str, Block]:
    """The packaged neuron model (.pt2 path) and its CPU twin."""
    torch.manual_seed(0)
    cpu = Block().eval()
    model = Block().eval()
    model.load_state_dict(cpu.state_dict())
    model.to("neuron")
    x, mask = _inputs(8)
    length = torch.export.Dim("length", min=2, max=64)
    program = torch.export.export(
        model,
        (x.to("neuron"), mask.to("neuron")),
        dynamic_shapes=({1: length}, {0: length, 1: length}),
    )
    path = str(tmp_path_factory.mktemp("aoti") / "block.pt2")
    assert torch._inductor.aoti_compile_and_package(program, package_path=path) == path
    return path, cpu


def test_package_runs_on_neuron_like_cpu(package):
    path, cpu = package
    runner = torch._inductor.aoti_load_package(path)
    torch.neuron.clear_op_tracking()
    for length in (8, 24):
        x, mask = _inputs(length)
        x_dev = x.to("neuron")
        *got, size = runner(x_dev, mask.to("neuron"))
        with torch.no_grad():
            *want, want_size = cpu(x, mask)
        for g, w in zip(got, want, strict=True):
            assert g.device == torch.device("neuron:0")
            torch.testing.assert_close(g.cpu(), w, **TOL)
        # A size comes back as a CPU scalar tensor, as AOTInductor returns it on the CPU.
        assert size.device.type == "cpu" and size.item() == want_size
        # The view of an input stays a view of the neuron input.
        assert got[1].untyped_storage().data_ptr() == x_dev.untyped_storage().data_ptr()
    assert torch.neuron.get_executed_ops()["aoti::model_run"] == 2
    # Every output was born in device memory: none had to be copied in.
    assert torch.neuron.get_fallback_ops() == {}


def test_package_on_second_device_and_wrong_device_is_named(package):
    path, cpu = package
    x, mask = _inputs(8)
    with torch.no_grad():
        want = cpu(x, mask)[0]
    # Without a device_index the package runs where its inputs are.
    got = torch._inductor.aoti_load_package(path)(x.to("neuron:1"), mask.to("neuron:1"))[0]
    assert got.device == torch.device("neuron:1")
    torch.testing.assert_close(got.cpu(), want, **TOL)
    pinned = torch._inductor.aoti_load_package(path, device_index=1)
    with pytest.raises(RuntimeError, match=r"neuron:1 got input 0 on neuron:0.*\.to\(\)"):
        pinned(x.to("neuron:0"), mask.to("neuron:0"))


def test_package_loads_and_runs_in_a_fresh_process(package, tmp_path):
    path, cpu = package
    x, mask = _inputs(12)
    with torch.no_grad():
        want = cpu(x, mask)
    data = tmp_path / "io.pt"
    torch.save({"x": x, "mask": mask, "want": list(want[:3])}, data)
    result = run_python(
        f"""
        import torch
        io = torch.load({str(data)!r})
        runner = torch._inductor.aoti_load_package({path!r})
        got = runner(io["x"].to("neuron"), io["mask"].to("neuron"))[:3]
        for g, w in zip(got, io["want"], strict=True):
            assert g.device.type == "neuron", g.device
            torch.testing.assert_close(g.cpu(), w, atol=1e-5, rtol=1e-4)
        assert torch.neuron.get_fallback_ops() == {{}}
        print("ok")
        """
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", describe(result)
    assert "outdated" not in result.stderr, describe(result)


def test_program_returning_a_cpu_tensor_is_refused_before_compiling_cpp():
    class ReturnsCpu(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x * 2, x.sum().cpu()

    program = torch.export.export(ReturnsCpu(), (torch.randn(3, device="neuron"),))
    with pytest.raises(Exception, match="output 1 of the program is on cpu.*Return it on neuron"):
        torch._inductor.aoti_compile_and_package(program)


def test_jit_cpp_wrapper_is_refused_with_the_alternatives():
    torch._dynamo.reset()
    compiled = torch.compile(lambda a: a.sin() + 1, options={"cpp_wrapper": True})
    with pytest.raises(Exception, match="cpp_wrapper.*not supported for neuron.*aoti_compile"):
        compiled(torch.randn(4, device="neuron"))
    torch._dynamo.reset()
