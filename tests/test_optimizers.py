"""Fused and foreach optimizers on neuron: a step equals the CPU step.

torch.optim picks the fused kernels (``_fused_adamw_``, ``_fused_adam_``, ``_fused_sgd_``) or
the ``_foreach_*`` family for an accelerator. Each configuration trains the same small model
for three steps on neuron and on the CPU (same configuration, same data).

Tolerances: with the same parameters and gradients, the optimizer step on neuron must equal
the CPU step exactly (it runs the same kernels); after three end-to-end training steps
(forward, backward, step) the parameters and optimizer state must agree within float32
tolerance, ``torch.testing.assert_close``'s default for float32 (rtol 1.3e-6, atol 1e-5),
because the forward and backward may round differently.
"""

from __future__ import annotations

import copy
import tempfile

import pytest
import torch
from conftest import tiny_llama
from torch import nn

STEPS = 3

CONFIGS = {
    "adamw_fused": (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1, "fused": True}),
    "adam_fused": (torch.optim.Adam, {"lr": 1e-2, "weight_decay": 1e-2, "fused": True}),
    "sgd_fused": (
        torch.optim.SGD,
        {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-2, "fused": True},
    ),
    "adamw_fused_amsgrad": (
        torch.optim.AdamW,
        {"lr": 1e-2, "amsgrad": True, "fused": True},
    ),
    "sgd_fused_nesterov": (
        torch.optim.SGD,
        {"lr": 0.1, "momentum": 0.9, "nesterov": True, "fused": True},
    ),
    "adamw_foreach": (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1, "foreach": True}),
    "adam_foreach": (torch.optim.Adam, {"lr": 1e-2, "weight_decay": 1e-2, "foreach": True}),
    "sgd_foreach": (
        torch.optim.SGD,
        {"lr": 0.1, "momentum": 0.9, "weight_decay": 1e-2, "foreach": True},
    ),
}

FUSED_KERNEL = {
    torch.optim.AdamW: "aten::_fused_adamw_",
    torch.optim.Adam: "aten::_fused_adam_",
    torch.optim.SGD: "aten::_fused_sgd_",
}


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(8, 32),
        nn.GELU(),
        nn.LayerNorm(32),
        nn.Linear(32, 32),
        nn.SiLU(),
        nn.Linear(32, 4),
    )


def batches():
    generator = torch.Generator().manual_seed(1)
    return [
        (torch.randn(16, 8, generator=generator), torch.randn(16, 4, generator=generator))
        for _ in range(STEPS)
    ]


def train(model, optimizer, device):
    for x, y in batches():
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
        loss.backward()
        optimizer.step()


def state_tensors(optimizer):
    """The optimizer state (exp_avg, exp_avg_sq, momentum_buffer, step, ...) in order."""
    out = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            for key, value in sorted(optimizer.state[p].items()):
                if isinstance(value, torch.Tensor):
                    out.append((key, value))
    return out


def assert_same(cpu_model, cpu_opt, neuron_model, neuron_opt, **tolerance):
    for (name, a), b in zip(cpu_model.named_parameters(), neuron_model.parameters(), strict=True):
        assert b.device.type == "neuron"
        torch.testing.assert_close(
            b.detach().cpu(), a.detach(), msg=f"parameter {name}", **tolerance
        )
    cpu_state, neuron_state = state_tensors(cpu_opt), state_tensors(neuron_opt)
    assert [k for k, _ in cpu_state] == [k for k, _ in neuron_state]
    assert cpu_state, "the optimizer kept no state"
    for (key, a), (_, b) in zip(cpu_state, neuron_state, strict=True):
        torch.testing.assert_close(b.cpu(), a, msg=f"state {key}", **tolerance)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_training_steps_match_cpu(name):
    cls, kwargs = CONFIGS[name]
    cpu_model = make_model()
    neuron_model = copy.deepcopy(cpu_model).to("neuron")
    cpu_opt = cls(cpu_model.parameters(), **kwargs)
    neuron_opt = cls(neuron_model.parameters(), **kwargs)
    torch.neuron.clear_op_tracking()
    train(cpu_model, cpu_opt, "cpu")
    train(neuron_model, neuron_opt, "neuron")
    executed = torch.neuron.get_executed_ops()
    if kwargs.get("fused"):
        assert executed.get(FUSED_KERNEL[cls], 0) == STEPS, sorted(executed)
    # The optimizer kernels ran over device memory (no counted copy through the host).
    fallbacks = torch.neuron.get_fallback_ops()
    assert not [k for k in fallbacks if "_fused_" in k or "_foreach_" in k], fallbacks
    # The parameters moved: the comparison is not between two untouched models.
    assert not torch.equal(next(cpu_model.parameters()), next(make_model().parameters()))
    assert_same(cpu_model, cpu_opt, neuron_model, neuron_opt)  # float32 default tolerance


@pytest.mark.parametrize("name", list(CONFIGS))
def test_step_equals_cpu_step_exactly(name):
    """Same parameters and gradients on both devices: the optimizer alone must agree bit for bit."""
    cls, kwargs = CONFIGS[name]
    cpu_model = make_model()
    neuron_model = copy.deepcopy(cpu_model).to("neuron")
    cpu_opt = cls(cpu_model.parameters(), **kwargs)
    neuron_opt = cls(neuron_model.parameters(), **kwargs)
    generator = torch.Generator().manual_seed(2)
    for _ in range(STEPS):
        for a, b in zip(cpu_model.parameters(), neuron_model.parameters(), strict=True):
            a.grad = torch.randn(a.shape, generator=generator)
            b.grad = a.grad.to("neuron")
        cpu_opt.step()
        neuron_opt.step()
    assert_same(cpu_model, cpu_opt, neuron_model, neuron_opt, rtol=0, atol=0)


def test_neuron_is_a_fused_and_foreach_device():
    """torch.optim lists neuron among the devices its fused and foreach kernels support."""
    from torch.utils._foreach_utils import (
        _get_foreach_kernels_supported_devices,
        _get_fused_kernels_supported_devices,
    )

    assert "neuron" in _get_fused_kernels_supported_devices()
    assert "neuron" in _get_foreach_kernels_supported_devices()
    p = nn.Parameter(torch.ones(3, device="neuron"))
    optimizer = torch.optim.AdamW([p], lr=0.5, fused=True)
    p.grad = torch.ones(3, device="neuron")
    optimizer.step()
    assert optimizer.defaults["fused"] is True
    assert (p.detach().cpu() < 1).all()


def test_transformers_adamw_torch_fused():
    """Transformers' default fused optimizer name creates AdamW(fused=True) for a model on
    neuron, and three training steps equal the CPU's within float32 tolerance."""
    from transformers import Trainer, TrainingArguments

    with tempfile.TemporaryDirectory() as tmp:
        args = TrainingArguments(
            output_dir=tmp, optim="adamw_torch_fused", learning_rate=1e-3, report_to=[]
        )
        assert args.device.type == "neuron"
        cpu_model = tiny_llama()
        neuron_model = copy.deepcopy(cpu_model)
        trainer = Trainer(model=neuron_model, args=args)
        neuron_opt = trainer.create_optimizer()
        optimizer_cls, optimizer_kwargs = Trainer.get_optimizer_cls_and_kwargs(args, cpu_model)
    assert isinstance(neuron_opt, torch.optim.AdamW)
    assert neuron_opt.defaults["fused"] is True
    assert next(neuron_model.parameters()).device.type == "neuron"
    cpu_opt = optimizer_cls(
        [
            {"params": [p for n, p in cpu_model.named_parameters() if n in names], **extra}
            for names, extra in _groups(neuron_opt, neuron_model)
        ],
        **optimizer_kwargs,
    )

    generator = torch.Generator().manual_seed(3)
    torch.neuron.clear_op_tracking()
    for _ in range(STEPS):
        ids = torch.randint(0, 64, (2, 12), generator=generator)
        for model, optimizer, device in (
            (cpu_model, cpu_opt, "cpu"),
            (neuron_model, neuron_opt, "neuron"),
        ):
            optimizer.zero_grad()
            batch = ids.to(device)
            model(input_ids=batch, labels=batch).loss.backward()
            optimizer.step()
    assert torch.neuron.get_executed_ops().get("aten::_fused_adamw_", 0) >= STEPS
    assert_same(cpu_model, cpu_opt, neuron_model, neuron_opt)


def _groups(optimizer, model):
    """The Trainer's parameter groups (weight decay / no decay) by parameter name."""
    names = {id(p): n for n, p in model.named_parameters()}
    for group in optimizer.param_groups:
        extra = {k: v for k, v in group.items() if k == "weight_decay"}
        yield {names[id(p)] for p in group["params"]}, extra
