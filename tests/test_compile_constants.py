"""Tensor constants in graphs compiled with backend="neuron".

A `torch.tensor(...)` literal inside compiled code becomes a constant of the ATen graph.
The backend copies it to the host and hashes its bytes into the cache key. Both run inside
the graph's FakeTensorMode (Inductor calls the inner compile there). The copy once became a
fake tensor, which lost the value, and the hash then failed with `.numpy() is not supported
for tensor subclasses`: Transformers' default compiled generation of AFMoE hit this.
References: the same function run eagerly on the CPU (bitwise equal here, since Inductor
does not reorder an elementwise multiply-add), and the key of the same graph built outside
any fake mode.
"""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode

import torchneuron.compile.backend as neuron_compile


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    torch.neuron.reset_dynamo_metrics()
    yield
    torch._dynamo.reset()


def _scale_shift(scale: list[float], shift: int):  # noqa: ANN202 - a function under test
    def f(x: torch.Tensor) -> torch.Tensor:
        # a 3-element constant (no value kept by FakeTensorMode) and a 0-dim one
        return x * torch.tensor(scale, device=x.device) + torch.tensor(shift, device=x.device)

    return f


def test_tensor_constants_keep_their_values_and_key_the_cache():
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    first = _scale_shift([3.0, -2.0, 5.0], 7)
    got = torch.compile(first, backend="neuron")(x.to("neuron"))
    assert got.device.type == "neuron"
    assert torch.equal(got.cpu(), first(x))
    misses = torch.neuron.get_dynamo_metrics()["cache_misses"]
    # the same code with other constant values is another graph, not a cache hit
    second = _scale_shift([1.0, 0.5, -4.0], -2)
    got = torch.compile(second, backend="neuron")(x.to("neuron"))
    assert torch.equal(got.cpu(), second(x))
    assert torch.neuron.get_dynamo_metrics()["cache_misses"] == misses + 1


class _WithConstant(torch.nn.Module):
    def __init__(self, constant: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("constant", constant)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.constant


def _key(constant: torch.Tensor) -> str | None:
    gm = torch.fx.symbolic_trace(_WithConstant(torch.zeros(3)))
    gm.constant = constant  # set after tracing: the value under test, as the compiler sees it
    return neuron_compile._graph_key(gm, [torch.empty(3)], {})


def test_graph_key_reads_real_constants_inside_a_fake_mode():
    constant = torch.tensor([1.0, 2.0, 3.0])
    plain = _key(constant)
    assert plain is not None
    with FakeTensorMode():
        assert _key(constant) == plain
    assert _key(torch.tensor([1.0, 2.0, 4.0])) != plain
    assert _key(torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)) != plain


def test_graph_key_of_zero_dim_and_non_contiguous_constants():
    assert _key(torch.tensor(2.5)) not in (None, _key(torch.tensor(3.5)))
    strided = torch.arange(6.0).reshape(2, 3).t()
    assert _key(strided) not in (None, _key(strided.contiguous()))  # layout is part of the key


def test_graph_key_of_fake_constants():
    mode = FakeTensorMode()
    real = torch.tensor([4])
    with mode:
        unknown = torch.empty(3)  # a fake tensor with no value
    known = mode.from_tensor(real)
    known.constant = real  # what FakeTensorMode keeps for small literals
    assert _key(unknown) is None  # compiled, not cached: no bytes to hash
    assert _key(known) == _key(real)


def test_graph_key_of_functional_and_subclass_constants():
    from torch.testing._internal.two_tensor import TwoTensor

    real = torch.tensor([1.0, -1.0, 0.5])
    functional = torch._to_functional_tensor(real)
    assert _key(functional) == _key(real)

    class Tagged(torch.Tensor):
        pass

    tagged = _key(real.as_subclass(Tagged))
    assert tagged is not None and tagged != _key(real)
    assert _key(TwoTensor(real, real.clone())) is None  # defined by inner tensors + metadata


def test_graph_key_depends_on_what_each_node_produces():
    # Same code, same inputs: only a node's value (a custom op's fake result) differs.
    gm = torch.fx.symbolic_trace(_WithConstant(torch.zeros(3)))
    keys = set()
    for dtype in (torch.float32, torch.bfloat16):
        for node in gm.graph.nodes:
            node.meta["val"] = torch.empty(3, dtype=dtype)
        keys.add(neuron_compile._graph_key(gm, [torch.empty(3)], {}))
    assert len(keys) == 2
