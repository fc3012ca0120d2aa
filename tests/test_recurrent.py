"""Recurrent layers on neuron against the same modules on the CPU.

nn.RNN (tanh, relu), nn.LSTM (with and without proj_size), nn.GRU and the three cells run on
neuron with the CPU's algorithm, op for op (csrc/aten/recurrent_*.cpp), over the CPU's own
kernels. So with TORCHNEURON_NATIVE_KERNELS=0 every comparison here has zero tolerance:
outputs, final states and the gradients of the input, the initial states and every parameter
are bitwise equal to the CPU's, in float32, float64 and bfloat16, and inter-layer dropout
draws the same mask from equal seeds. With the native kernels on (the default), the layers'
float32/bf16 matmuls run the native GEMM (csrc/kernels/gemm.h), which sums in another order:
those dtypes are compared at assert_close's default tolerance for the dtype (float32: rtol
1.3e-6, atol 1e-5; bf16: rtol 1.6e-2, atol 1e-5); float64 stays exact.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Sequence

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from torchneuron.compile.native_gemm import native_kernels_enabled

# The CPU reference warns that LSTMs with projections do not use oneDNN (neuron does not).
pytestmark = pytest.mark.filterwarnings("ignore:LSTM with projections is not supported")

EXACT = {"rtol": 0, "atol": 0}
NATIVE_GEMM = native_kernels_enabled()
DEVICE = "neuron"

SEQUENCE_MODULES: dict[str, Callable[..., nn.RNNBase]] = {
    "rnn_tanh": lambda **kw: nn.RNN(nonlinearity="tanh", **kw),
    "rnn_relu": lambda **kw: nn.RNN(nonlinearity="relu", **kw),
    "gru": nn.GRU,
    "lstm": nn.LSTM,
    "lstm_proj": lambda **kw: nn.LSTM(proj_size=3, **kw),
}
CELL_MODULES: dict[str, Callable[..., nn.RNNCellBase]] = {
    "rnn_tanh_cell": lambda **kw: nn.RNNCell(nonlinearity="tanh", **kw),
    "rnn_relu_cell": lambda **kw: nn.RNNCell(nonlinearity="relu", **kw),
    "gru_cell": nn.GRUCell,
    "lstm_cell": nn.LSTMCell,
}
INPUT_SIZE, HIDDEN_SIZE, STEPS, BATCH = 4, 5, 6, 4


def make_sequence_module(kind: str, dtype: torch.dtype = torch.float32, **kw) -> nn.RNNBase:
    torch.manual_seed(0)
    return SEQUENCE_MODULES[kind](input_size=INPUT_SIZE, hidden_size=HIDDEN_SIZE, **kw).to(dtype)


def initial_states(module: nn.RNNBase, batch: int) -> tuple[torch.Tensor, ...]:
    layers = module.num_layers * (2 if module.bidirectional else 1)
    h_size = module.proj_size if getattr(module, "proj_size", 0) else module.hidden_size
    h0 = torch.randn(layers, batch, h_size, dtype=module.weight_hh_l0.dtype)
    if isinstance(module, nn.LSTM):
        return h0, torch.randn(layers, batch, module.hidden_size, dtype=h0.dtype)
    return (h0,)


def leaf(t: torch.Tensor, device: str) -> torch.Tensor:
    return t.detach().to(device).requires_grad_()


def loss_of(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """A loss whose gradient differs per element, so every gradient entry is exercised."""
    return sum((t.float().sin() * (1 + i)).sum() for i, t in enumerate(tensors))


def run_sequence(
    module: nn.RNNBase,
    device: str,
    x: torch.Tensor,
    initial: tuple[torch.Tensor, ...] | None,
    lengths: torch.Tensor | None = None,
    enforce_sorted: bool = True,
    seed: int | None = None,
    backward: bool = True,
) -> list[torch.Tensor]:
    """Output, final states, then (with `backward`) the gradients of input, initial states
    and every parameter, from a copy of `module` on `device`."""
    m = copy.deepcopy(module).to(device)
    x_leaf = leaf(x, device)
    leaves = [x_leaf]
    hx = None
    if initial is not None:
        states = tuple(leaf(t, device) for t in initial)
        leaves += states
        hx = states if len(states) == 2 else states[0]
    inp = x_leaf
    if lengths is not None:
        inp = pack_padded_sequence(
            x_leaf, lengths, batch_first=m.batch_first, enforce_sorted=enforce_sorted
        )
    if seed is not None:
        torch.manual_seed(seed)  # seeds the CPU and every neuron generator alike
    out, state = m(inp, hx)
    if lengths is not None:
        out, _ = pad_packed_sequence(out, batch_first=m.batch_first)
    results = [out, *(state if isinstance(state, tuple) else (state,))]
    if not backward:
        return results
    loss_of(results).backward()
    grads = [t.grad for t in leaves] + [p.grad for p in m.parameters()]
    assert all(g is not None for g in grads), "every input and parameter gets a gradient"
    return results + grads


def assert_same(cpu: Sequence[torch.Tensor], neuron: Sequence[torch.Tensor]) -> None:
    for i, (c, n) in enumerate(zip(cpu, neuron, strict=True)):
        assert n.device.type == DEVICE, f"result {i} is on {n.device}"
        tolerance = {} if NATIVE_GEMM and c.dtype != torch.float64 else EXACT
        torch.testing.assert_close(n.cpu(), c, **tolerance, msg=lambda m, i=i: f"result {i}: {m}")


def sequence_input(batch_first: bool, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    torch.manual_seed(1)
    shape = (BATCH, STEPS, INPUT_SIZE) if batch_first else (STEPS, BATCH, INPUT_SIZE)
    return torch.randn(shape, dtype=dtype)


def test_issue_10_lstm_repro_runs_on_neuron():
    """The issue's repro raised NotImplementedError (aten::_thnn_fused_lstm_cell)."""
    lstm = torch.nn.LSTM(10, 20).to("neuron")
    x = torch.randn(5, 2, 10, device="neuron")
    out, (h, c) = lstm(x)
    assert out.shape == (5, 2, 20) and h.shape == c.shape == (1, 2, 20)
    ref_out, (ref_h, ref_c) = copy.deepcopy(lstm).cpu()(x.cpu())
    assert_same([ref_out, ref_h, ref_c], [out, h, c])


@pytest.mark.parametrize("kind", list(SEQUENCE_MODULES))
@pytest.mark.parametrize(
    "num_layers,bidirectional,bias,batch_first,with_initial",
    [
        # every pair of the four switches below appears together at least once
        (1, False, True, False, False),
        (1, True, False, True, True),
        (2, False, False, True, False),
        (2, True, True, False, True),
        (2, True, False, False, False),
        (3, False, True, True, True),
        (3, True, True, True, False),
    ],
)
def test_sequence_matches_cpu(kind, num_layers, bidirectional, bias, batch_first, with_initial):
    module = make_sequence_module(
        kind, num_layers=num_layers, bidirectional=bidirectional, bias=bias, batch_first=batch_first
    )
    x = sequence_input(batch_first)
    initial = initial_states(module, BATCH) if with_initial else None
    assert_same(run_sequence(module, "cpu", x, initial), run_sequence(module, DEVICE, x, initial))


@pytest.mark.parametrize("kind", list(SEQUENCE_MODULES))
@pytest.mark.parametrize("enforce_sorted", [True, False])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_packed_sequence_matches_cpu(kind, enforce_sorted, bidirectional):
    batch_first = not enforce_sorted  # both layouts, across the cases
    module = make_sequence_module(
        kind, num_layers=2, bidirectional=bidirectional, batch_first=batch_first
    )
    x = sequence_input(batch_first)
    # Sorted lengths shrink the batch twice; unsorted ones need the permutation.
    lengths = torch.tensor([6, 4, 4, 1] if enforce_sorted else [4, 6, 1, 4])
    initial = initial_states(module, BATCH)
    cpu = run_sequence(module, "cpu", x, initial, lengths, enforce_sorted)
    assert_same(cpu, run_sequence(module, DEVICE, x, initial, lengths, enforce_sorted))


@pytest.mark.parametrize("kind", ["rnn_tanh", "gru", "lstm", "lstm_proj"])
@pytest.mark.parametrize("packed", [False, True])
def test_dropout_between_layers_matches_cpu_with_equal_seeds(kind, packed):
    module = make_sequence_module(kind, num_layers=3, bidirectional=True, dropout=0.5).train()
    x = sequence_input(batch_first=False)
    lengths = torch.tensor([6, 5, 3, 2]) if packed else None
    cpu = run_sequence(module, "cpu", x, None, lengths, seed=7)
    neuron = run_sequence(module, DEVICE, x, None, lengths, seed=7)
    assert_same(cpu, neuron)
    # The masks really are applied: the same module without dropout gives other outputs.
    plain = run_sequence(module.eval(), DEVICE, x, None, lengths, backward=False)
    assert not torch.equal(plain[0].cpu(), neuron[0].cpu())


@pytest.mark.parametrize("kind", list(SEQUENCE_MODULES))
def test_bfloat16_matches_cpu_bfloat16(kind):
    module = make_sequence_module(kind, torch.bfloat16, num_layers=2, bidirectional=True)
    x = sequence_input(batch_first=False, dtype=torch.bfloat16)
    initial = initial_states(module, BATCH)
    assert_same(run_sequence(module, "cpu", x, initial), run_sequence(module, DEVICE, x, initial))


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn_relu"])
@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_sequence_without_autograd_matches_cpu(kind, context):
    module = make_sequence_module(kind, num_layers=2)
    x = sequence_input(batch_first=False)
    with context():
        cpu = run_sequence(module, "cpu", x, None, backward=False)
        neuron = run_sequence(module, DEVICE, x, None, backward=False)
    assert_same(cpu, neuron)


def test_unbatched_input_matches_cpu():
    module = make_sequence_module("lstm", num_layers=2, bidirectional=True)
    x = sequence_input(batch_first=False)[:, 0]
    assert_same(run_sequence(module, "cpu", x, None), run_sequence(module, DEVICE, x, None))


def test_autocast_lstm_matches_cpu_autocast():
    """Under autocast the LSTM layer kernel computes in bfloat16 through oneDNN, as in CPU
    autocast. Where oneDNN has no bf16 LSTM (below AVX-512) CPU autocast raises; neuron takes
    the CPU's other path there, so the reference is CPU autocast with oneDNN off."""
    module = make_sequence_module("lstm", num_layers=2, bidirectional=True)
    x = sequence_input(batch_first=False)
    onednn_bf16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    results = []
    for device in ["cpu", DEVICE]:
        onednn = contextlib.nullcontext() if onednn_bf16 else torch.backends.mkldnn.flags(False)
        with onednn if device == "cpu" else contextlib.nullcontext():
            with torch.autocast(device, dtype=torch.bfloat16):
                results.append(run_sequence(module, device, x, None))
    # oneDNN's layer returns bf16; the other path's cells return float32.
    assert results[0][0].dtype == (torch.bfloat16 if onednn_bf16 else torch.float32)
    assert_same(*results)


def run_cell(
    module: nn.RNNCellBase, device: str, x: torch.Tensor, initial: tuple[torch.Tensor, ...] | None
) -> list[torch.Tensor]:
    m = copy.deepcopy(module).to(device)
    x_leaf = leaf(x, device)
    leaves = [x_leaf]
    hx = None
    if initial is not None:
        states = tuple(leaf(t, device) for t in initial)
        leaves += states
        hx = states if len(states) == 2 else states[0]
    result = m(x_leaf, hx)
    results = list(result) if isinstance(result, tuple) else [result]
    loss_of(results).backward()
    return results + [t.grad for t in leaves] + [p.grad for p in m.parameters()]


@pytest.mark.parametrize("kind", list(CELL_MODULES))
@pytest.mark.parametrize(
    "bias,with_initial,batched", [(True, True, True), (False, False, True), (True, False, False)]
)
def test_cell_matches_cpu(kind, bias, with_initial, batched):
    torch.manual_seed(0)
    module = CELL_MODULES[kind](input_size=INPUT_SIZE, hidden_size=HIDDEN_SIZE, bias=bias)
    shape = (BATCH, INPUT_SIZE) if batched else (INPUT_SIZE,)
    x = torch.randn(shape)
    initial = None
    if with_initial:
        state_shape = (BATCH, HIDDEN_SIZE) if batched else (HIDDEN_SIZE,)
        count = 2 if kind == "lstm_cell" else 1
        initial = tuple(torch.randn(state_shape) for _ in range(count))
    assert_same(run_cell(module, "cpu", x, initial), run_cell(module, DEVICE, x, initial))


def second_order_grads(module: nn.Module, device: str, x: torch.Tensor) -> list[torch.Tensor]:
    """d/d(input, params) of |d loss / d input|^2: needs backward of the backward."""
    m = copy.deepcopy(module).to(device)
    x_leaf = leaf(x, device)
    result = m(x_leaf)
    output = result[0] if isinstance(result, tuple) else result
    (grad_x,) = torch.autograd.grad(output.sin().sum(), x_leaf, create_graph=True)
    grad_x.pow(2).sum().backward()
    return [grad_x, x_leaf.grad] + [p.grad for p in m.parameters()]


@pytest.mark.parametrize(
    "kind,dtype",
    [
        ("lstm", torch.float32),  # the oneDNN layer's differentiable backward, as on the CPU
        ("lstm", torch.float64),  # the cell-by-cell path
        ("gru", torch.float32),
        ("rnn_tanh", torch.float32),
        ("lstm_cell", torch.float32),
        ("gru_cell", torch.float32),
    ],
)
def test_double_backward_matches_cpu(kind, dtype):
    if kind in CELL_MODULES:
        torch.manual_seed(0)
        module = CELL_MODULES[kind](input_size=INPUT_SIZE, hidden_size=HIDDEN_SIZE).to(dtype)
        x = torch.randn(BATCH, INPUT_SIZE, dtype=dtype)
    else:
        module = make_sequence_module(kind, dtype, num_layers=2)
        x = sequence_input(batch_first=False, dtype=dtype)
    assert_same(second_order_grads(module, "cpu", x), second_order_grads(module, DEVICE, x))


def test_recurrent_ops_are_counted():
    torch.neuron.clear_op_tracking()
    x = sequence_input(batch_first=False).to(DEVICE)
    make_sequence_module("gru").to(DEVICE)(x)[0].sum().backward()
    make_sequence_module("lstm").to(DEVICE)(x)[0].sum().backward()
    packed = pack_padded_sequence(x, torch.tensor([6, 5, 2, 1]))
    make_sequence_module("rnn_tanh").to(DEVICE)(packed)
    nn.LSTMCell(INPUT_SIZE, HIDDEN_SIZE).to(DEVICE)(x[0])
    executed = torch.neuron.get_executed_ops()
    for op in ["aten::gru.input", "aten::lstm.input", "aten::rnn_tanh.data", "aten::lstm_cell"]:
        assert executed.get(op) == 1, (op, executed)
    # The ops they are made of are counted too, on the ordinary paths.
    for op in ["aten::addmm", "aten::mkldnn_rnn_layer", "aten::mkldnn_rnn_layer_backward"]:
        assert executed.get(op, 0) >= 1, (op, executed)
    assert torch.neuron.get_fallback_ops() == {}


def test_parameters_on_another_device_are_reported():
    module = make_sequence_module("lstm")  # left on the CPU
    with pytest.raises(RuntimeError, match="not at the same device"):
        module(sequence_input(batch_first=False).to(DEVICE))


def test_packed_batch_sizes_must_be_on_the_cpu():
    module = make_sequence_module("gru").to(DEVICE)
    packed = pack_padded_sequence(sequence_input(batch_first=False), torch.tensor([6, 5, 2, 1]))
    data, batch_sizes = packed.data.to(DEVICE), packed.batch_sizes.to(DEVICE)
    hx = torch.zeros(1, BATCH, HIDDEN_SIZE, device=DEVICE)
    with pytest.raises(RuntimeError, match="batch_sizes of a packed sequence must be a CPU"):
        torch.gru(data, batch_sizes, hx, module._flat_weights, True, 1, 0.0, False, False)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_empty_sequence_is_rejected_as_on_cpu(kind):
    module = make_sequence_module(kind)
    x = torch.randn(0, BATCH, INPUT_SIZE)
    with pytest.raises(RuntimeError, match="sequence length to be larger than 0"):
        module(x)
    with pytest.raises(RuntimeError, match="sequence length to be larger than 0"):
        copy.deepcopy(module).to(DEVICE)(x.to(DEVICE))
