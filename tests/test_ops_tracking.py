"""Which kernels ops run on neuron (executed-op counts, CPU fallbacks), and ops whose
kernels take unusual paths, checked against the CPU."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from support.op_check import DEVICE, EXACT

# ---------------------------------------------------------------------------- op tracking


def test_executed_ops_counts_and_clear():
    a = torch.randn(4, 4, device=DEVICE)
    b = torch.randn(4, 4, device=DEVICE)
    torch.neuron.clear_op_tracking()
    assert {k: v for k, v in torch.neuron.get_executed_ops().items() if v} == {}
    assert {k: v for k, v in torch.neuron.get_fallback_ops().items() if v} == {}
    for _ in range(3):
        torch.add(a, b)
    torch.mm(a, b)
    torch.sigmoid(a)
    ops = torch.neuron.get_executed_ops()
    assert ops.get("aten::add.Tensor") == 3
    assert ops.get("aten::mm") == 1
    assert ops.get("aten::sigmoid") == 1
    assert "aten::sub.Tensor" not in ops or ops["aten::sub.Tensor"] == 0
    torch.neuron.clear_op_tracking()
    assert {k: v for k, v in torch.neuron.get_executed_ops().items() if v} == {}
    torch.sub(a, b)
    assert torch.neuron.get_executed_ops().get("aten::sub.Tensor") == 1
    assert torch.neuron.get_executed_ops().get("aten::add.Tensor", 0) == 0


def test_cpu_ops_are_not_counted():
    torch.neuron.clear_op_tracking()
    x = torch.randn(8, 8)
    (x @ x).relu().sum()
    assert {k: v for k, v in torch.neuron.get_executed_ops().items() if v} == {}


def test_no_fallbacks_in_ordinary_workload():
    torch.manual_seed(0)
    torch.neuron.clear_op_tracking()
    emb = torch.nn.Embedding(50, 16).to(DEVICE)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True).to(DEVICE)
    head = torch.nn.Linear(16, 50).to(DEVICE)
    params = list(emb.parameters()) + list(layer.parameters()) + list(head.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3)
    tokens = torch.randint(0, 50, (2, 7), device=DEVICE)
    for _ in range(2):
        opt.zero_grad()
        h = layer(
            emb(tokens),
            is_causal=True,
            src_mask=torch.nn.Transformer.generate_square_subsequent_mask(7, device=DEVICE),
        )
        logits = head(h)
        loss = F.cross_entropy(logits.flatten(0, 1), tokens.flatten())
        loss.backward()
        opt.step()
    x = torch.randn(3, 5, device=DEVICE)
    x.sort(1)
    x.topk(2)
    x.cumsum(0)
    x[x > 0]
    torch.nonzero(x)
    x.argmax()
    F.softmax(x, 1)
    x.to(torch.bfloat16).float()
    F.max_pool2d(torch.randn(1, 2, 6, 6, device=DEVICE), 2)
    F.scaled_dot_product_attention(*(torch.randn(1, 2, 4, 8, device=DEVICE) for _ in range(3)))
    torch.cat([x, x]).split(2)
    loss.item()
    executed = torch.neuron.get_executed_ops()
    assert executed.get("aten::mm", 0) + executed.get("aten::addmm", 0) > 0
    assert sum(executed.values()) > 50
    assert {k: v for k, v in torch.neuron.get_fallback_ops().items() if v} == {}


def test_histc_integer_input_counts_like_cuda():
    # CUDA accepts integer histc (Transformers' MoE routing relies on it); the counts come
    # back in the input's dtype and equal the float histogram's, exactly.
    values = torch.tensor([0, 1, 1, 3, 2, 2, 2, 7], dtype=torch.int32)
    result = torch.histc(values.to("neuron"), bins=4, min=0, max=3)
    assert result.device.type == "neuron" and result.dtype == torch.int32
    expected = torch.histc(values.to(torch.float64), bins=4, min=0, max=3).to(torch.int32)
    assert torch.equal(result.cpu(), expected)
    assert result.cpu().tolist() == [1, 2, 3, 1]


def test_conjugate_and_negative_views_compute_like_cpu():
    # Ops on conj/neg views used to recurse (conj fallback -> clone -> copy_ -> _copy_from).
    x = torch.randn(5, dtype=torch.complex64)
    xn = x.to("neuron")
    assert torch.equal(xn.conj().clone().cpu(), x.conj().clone())
    assert torch.equal((xn.conj() * 2).cpu(), x.conj() * 2)
    assert torch.equal(xn.conj().resolve_conj().cpu(), x.conj().resolve_conj())
    r = torch.randn(4)
    assert torch.equal(r.to("neuron")._neg_view().cpu(), r._neg_view().resolve_neg())


def test_efficient_zero_tensor_on_device():
    zeros = torch._efficientzerotensor(3, device="neuron")
    assert zeros.device.type == "neuron"
    assert torch.equal((zeros + 1).cpu(), torch.ones(3))


def test_ops_with_a_cpu_and_an_implicit_composite_kernel_compute_like_cpu():
    # mish_backward has a CPU kernel and a CompositeImplicitAutograd decomposition; neuron
    # used the decomposition, whose bfloat16 rounding differs (nn.Mish's bfloat16 gradient
    # in the ModuleInfo sweep). It now runs the CPU kernel: bitwise equal. (Under
    # create_graph both devices use infinitely_differentiable_mish_backward instead.)
    torch.manual_seed(0)
    x = torch.randn(1000, dtype=torch.bfloat16, requires_grad=True)
    cotangent = torch.randn(1000, dtype=torch.bfloat16)
    (expected,) = torch.autograd.grad(F.mish(x), x, cotangent)
    x_dev = x.detach().to(DEVICE).requires_grad_(True)
    (grad,) = torch.autograd.grad(F.mish(x_dev), x_dev, cotangent.to(DEVICE))
    torch.testing.assert_close(grad.cpu(), expected, **EXACT)


def test_native_channel_shuffle_stays_differentiable():
    # Also CPU + CompositeImplicitAutograd, but kept on its decomposition: the CPU's
    # Autograd kernel for it raises "derivative not implemented".
    y = torch.randn(2, 6, 3, 3)
    y_dev = y.to(DEVICE).requires_grad_(True)
    shuffled = torch.native_channel_shuffle(y_dev, 3)
    torch.testing.assert_close(shuffled.cpu(), torch.native_channel_shuffle(y, 3), **EXACT)
    weights = torch.randn(shuffled.shape)
    (grad,) = torch.autograd.grad(shuffled, y_dev, weights.to(DEVICE))
    # The gradient of a permutation is its inverse: shuffling 6 channels in 2 groups undoes
    # shuffling them in 3.
    torch.testing.assert_close(grad.cpu(), torch.native_channel_shuffle(weights, 2), **EXACT)
