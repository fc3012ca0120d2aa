"""Training steps and higher-order gradients on neuron, and tensors moving between neuron
devices and the host, checked against the CPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from support.op_check import DEVICE, EXACT, FP32

# ---------------------------------------------------------------------------- autograd, training


def test_mlp_training_step_matches_cpu():
    torch.manual_seed(0)
    model_cpu = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 4)
    )
    model_dev = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.GELU(), torch.nn.Linear(16, 4)
    )
    model_dev.load_state_dict(model_cpu.state_dict())
    model_dev.to(DEVICE)
    opt_cpu = torch.optim.AdamW(model_cpu.parameters(), lr=1e-2)
    opt_dev = torch.optim.AdamW(model_dev.parameters(), lr=1e-2)
    x = torch.randn(10, 8)
    y = torch.randint(0, 4, (10,))
    for _ in range(3):
        for model, opt, device in ((model_cpu, opt_cpu, "cpu"), (model_dev, opt_dev, DEVICE)):
            opt.zero_grad()
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    for (name, p_cpu), p_dev in zip(
        model_cpu.named_parameters(), model_dev.parameters(), strict=True
    ):
        assert p_dev.device == DEVICE
        torch.testing.assert_close(p_dev.detach().cpu(), p_cpu.detach(), **FP32, msg=name)


def test_conv_net_with_batchnorm_training():
    torch.manual_seed(0)

    def make():
        return torch.nn.Sequential(
            torch.nn.Conv2d(3, 4, 3, padding=1),
            torch.nn.BatchNorm2d(4),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
            torch.nn.Flatten(),
            torch.nn.Linear(4 * 4 * 4, 3),
        )

    cpu = make()
    dev = make()
    dev.load_state_dict(cpu.state_dict())
    dev.to(DEVICE)
    x = torch.randn(5, 3, 8, 8)
    for model, device in ((cpu, "cpu"), (dev, DEVICE)):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for _ in range(2):
            opt.zero_grad()
            model(x.to(device)).square().mean().backward()
            opt.step()
    for (name, t_cpu), t_dev in zip(
        cpu.state_dict().items(), dev.state_dict().values(), strict=True
    ):
        torch.testing.assert_close(t_dev.cpu(), t_cpu, **FP32, msg=name)


def test_higher_order_grad():
    torch.manual_seed(0)
    x_cpu = torch.randn(5, requires_grad=True)
    x_dev = x_cpu.detach().to(DEVICE).requires_grad_(True)
    grads = []
    for x in (x_cpu, x_dev):
        (g,) = torch.autograd.grad((x.sin() * x).sum(), x, create_graph=True)
        (gg,) = torch.autograd.grad(g.sum(), x)
        grads.append(gg)
    torch.testing.assert_close(grads[1].cpu(), grads[0], **FP32)


# ---------------------------------------------------------------------------- across devices


def test_copy_between_neuron_devices():
    torch.manual_seed(0)
    cpu = torch.randn(16, 9)
    on0 = cpu.to("neuron:0")
    on1 = on0.to("neuron:1")
    assert on1.device == torch.device("neuron:1")
    assert on1.untyped_storage().data_ptr() != on0.untyped_storage().data_ptr()
    torch.testing.assert_close(on1.cpu(), cpu, **EXACT)
    # Non-contiguous source, dtype change, and copy_ into an existing tensor.
    on2 = torch.empty(9, 16, device="neuron:2")
    on2.copy_(on1.t())
    torch.testing.assert_close(on2.cpu(), cpu.t(), **EXACT)
    half = on0.t().to("neuron:3", torch.bfloat16)
    assert half.device == torch.device("neuron:3")
    torch.testing.assert_close(half.cpu(), cpu.t().to(torch.bfloat16), **EXACT)
    # Results of ops stay on the inputs' device and are independent of the source.
    result = on1 * 2 + 1
    assert result.device == torch.device("neuron:1")
    on0.zero_()
    torch.testing.assert_close(result.cpu(), cpu * 2 + 1, **EXACT)


def test_ops_allocate_on_their_device():
    before = torch.neuron.memory_allocated(2)
    x = torch.ones(1024, 256, device="neuron:2")
    y = x @ x.t()
    assert y.device == torch.device("neuron:2")
    assert torch.neuron.memory_allocated(2) >= before + x.numel() * 4 + y.numel() * 4
    assert torch.neuron.current_device() == 0
    assert y[0, 0].item() == 256.0


def test_autograd_across_devices():
    torch.manual_seed(0)
    w = torch.randn(4, 4)
    a = w.to("neuron:0").requires_grad_(True)
    b = (a * 2).to("neuron:1")
    loss = (b.sin()).sum()
    loss.backward()
    assert a.grad.device == torch.device("neuron:0")
    torch.testing.assert_close(a.grad.cpu(), 2 * torch.cos(2 * w), **FP32)


@pytest.mark.parametrize("contiguous", [True, False])
def test_non_blocking_copies(contiguous):
    torch.manual_seed(0)
    cpu = torch.randn(64, 33)
    src = cpu if contiguous else cpu.t()
    dev = src.to(DEVICE, non_blocking=True)
    back = torch.empty(src.shape)
    back.copy_(dev, non_blocking=True)
    other = dev.to("neuron:1", non_blocking=True)
    torch.neuron.synchronize()
    torch.neuron.synchronize(1)
    torch.testing.assert_close(dev.cpu(), src, **EXACT)
    torch.testing.assert_close(back, src, **EXACT)
    torch.testing.assert_close(other.cpu(), src, **EXACT)
    again = dev.to("cpu", non_blocking=True)
    torch.neuron.synchronize()
    torch.testing.assert_close(again, src, **EXACT)


def test_copy_into_noncontiguous_destination():
    src = torch.arange(12.0).view(3, 4)
    dst = torch.zeros(4, 3, device=DEVICE)
    dst.t().copy_(src)
    torch.testing.assert_close(dst.cpu(), src.t(), **EXACT)
    host = torch.zeros(4, 3)
    host.t().copy_(src.to(DEVICE))
    torch.testing.assert_close(host, src.t(), **EXACT)
    broadcast = torch.zeros(3, 4, device=DEVICE)
    broadcast.copy_(torch.arange(4.0))
    torch.testing.assert_close(broadcast.cpu(), torch.arange(4.0).expand(3, 4), **EXACT)
