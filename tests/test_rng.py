"""Random numbers on neuron: seeding, state save/restore, explicit generators."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from conftest import describe, start_python

EXACT = {"rtol": 0, "atol": 0}
DEVICE = "neuron"

FRESH_PROCESS = """
import json, torch
torch.manual_seed(1234)
a = torch.randn(8, device="neuron").tolist()
b = torch.randint(0, 1000, (6,), device="neuron").tolist()
c = torch.nn.functional.dropout(torch.ones(16, device="neuron"), 0.5).tolist()
d = torch.randn(4, device="neuron:1").tolist()
print(json.dumps([a, b, c, d]))
"""


@pytest.fixture(scope="module")
def fresh():
    return start_python(FRESH_PROCESS)


def draw_all(device: str = DEVICE) -> list[torch.Tensor]:
    """One of each kind of random op, so a replay checks them all."""
    x = torch.ones(64, device=device)
    return [
        torch.randn(5, 3, device=device),
        torch.rand(7, device=device),
        torch.randint(0, 100, (9,), device=device),
        torch.randperm(20, device=device),
        torch.bernoulli(torch.full((32,), 0.3, device=device)),
        F.dropout(x, 0.5, training=True),
        torch.nn.Dropout(0.25).train()(x.view(8, 8)),
        torch.empty(6, device=device).normal_(2.0, 3.0),
        torch.empty(6, device=device).uniform_(-1, 1),
        torch.empty(6, device=device).exponential_(),
        torch.multinomial(torch.tensor([0.1, 0.2, 0.3, 0.4], device=device), 8, replacement=True),
        torch.randn(4, dtype=torch.bfloat16, device=device),
    ]


def assert_same(first: list[torch.Tensor], second: list[torch.Tensor]) -> None:
    for a, b in zip(first, second, strict=True):
        assert a.device.type == "neuron"
        torch.testing.assert_close(a.cpu(), b.cpu(), **EXACT)


def test_manual_seed_reproducible():
    torch.manual_seed(42)
    first = draw_all()
    torch.manual_seed(42)
    second = draw_all()
    assert_same(first, second)


def test_different_seeds_differ():
    torch.manual_seed(1)
    a = torch.randn(100, device=DEVICE)
    torch.manual_seed(2)
    b = torch.randn(100, device=DEVICE)
    assert not torch.equal(a.cpu(), b.cpu())
    c = torch.randn(100, device=DEVICE)
    assert not torch.equal(b.cpu(), c.cpu())  # the generator advances


def test_manual_seed_seeds_every_device():
    torch.manual_seed(7)
    on0 = torch.randn(10, device="neuron:0")
    on1 = torch.randn(10, device="neuron:1")
    torch.manual_seed(7)
    torch.testing.assert_close(torch.randn(10, device="neuron:1").cpu(), on1.cpu(), **EXACT)
    # Every device's generator got the same seed, as torch.cuda does.
    torch.testing.assert_close(on0.cpu(), on1.cpu(), **EXACT)


def test_neuron_manual_seed_current_device_only():
    torch.neuron.manual_seed_all(5)
    base1 = torch.randn(6, device="neuron:1")
    torch.neuron.manual_seed_all(5)
    with torch.neuron.device(0):
        torch.neuron.manual_seed(99)  # only neuron:0
    assert torch.neuron.initial_seed() == 99
    with torch.neuron.device(1):
        assert torch.neuron.initial_seed() == 5
    torch.testing.assert_close(torch.randn(6, device="neuron:1").cpu(), base1.cpu(), **EXACT)
    torch.neuron.manual_seed(99)
    a = torch.randn(6, device="neuron:0")
    torch.neuron.manual_seed(99)
    torch.testing.assert_close(torch.randn(6, device="neuron:0").cpu(), a.cpu(), **EXACT)


def test_neuron_seed_does_not_touch_cpu_generator():
    torch.manual_seed(3)
    cpu_state = torch.get_rng_state()
    torch.neuron.manual_seed_all(11)
    torch.randn(100, device=DEVICE)
    assert torch.equal(torch.get_rng_state(), cpu_state)


def test_initial_seed_and_seed():
    torch.manual_seed(123)
    assert torch.neuron.initial_seed() == 123
    torch.neuron.seed()
    new_seed = torch.neuron.initial_seed()
    a = torch.randn(4, device=DEVICE)
    torch.neuron.manual_seed(new_seed)
    torch.testing.assert_close(torch.randn(4, device=DEVICE).cpu(), a.cpu(), **EXACT)


def test_get_set_rng_state_replays():
    torch.manual_seed(0)
    torch.randn(3, device=DEVICE)  # advance somewhere into the stream
    state = torch.neuron.get_rng_state()
    assert state.dtype == torch.uint8
    assert state.device.type == "cpu"
    first = draw_all()
    torch.neuron.set_rng_state(state)
    second = draw_all()
    assert_same(first, second)
    # the returned state is a copy: drawing more does not change it
    again = torch.neuron.get_rng_state()
    assert not torch.equal(again, state)


def test_rng_state_per_device():
    torch.manual_seed(0)
    state1 = torch.neuron.get_rng_state(1)
    state1_dev = torch.neuron.get_rng_state(torch.device("neuron:1"))
    assert torch.equal(state1, state1_dev)
    first = draw_all("neuron:1")
    torch.randn(10, device="neuron:0")
    torch.neuron.set_rng_state(state1, "neuron:1")
    assert_same(first, draw_all("neuron:1"))


def test_get_set_rng_state_all():
    torch.manual_seed(10)
    torch.randn(5, device="neuron:2")  # devices at different positions
    states = torch.neuron.get_rng_state_all()
    assert len(states) == torch.neuron.device_count()
    first = [torch.randn(6, device=f"neuron:{i}") for i in range(len(states))]
    torch.neuron.set_rng_state_all(states)
    second = [torch.randn(6, device=f"neuron:{i}") for i in range(len(states))]
    assert_same(first, second)
    assert not torch.equal(first[0].cpu(), first[2].cpu())


def test_fork_rng_restores_neuron_state():
    torch.manual_seed(0)
    expected = torch.randn(5, device=DEVICE)
    torch.manual_seed(0)
    with torch.random.fork_rng(devices=[0], device_type="neuron"):
        torch.randn(50, device=DEVICE)
    torch.testing.assert_close(torch.randn(5, device=DEVICE).cpu(), expected.cpu(), **EXACT)


def test_generator_object():
    g = torch.Generator(device=DEVICE)
    assert g.device.type == "neuron"
    g.manual_seed(2024)
    assert g.initial_seed() == 2024
    default_state = torch.neuron.get_rng_state()
    a = torch.randn(10, generator=g, device=DEVICE)
    b = torch.randint(0, 50, (10,), generator=g, device=DEVICE)
    c = torch.randperm(15, generator=g, device=DEVICE)
    d = torch.empty(8, device=DEVICE).bernoulli_(0.5, generator=g)
    # an explicit generator leaves the default generator alone
    assert torch.equal(torch.neuron.get_rng_state(), default_state)
    g.manual_seed(2024)
    assert_same(
        [a, b, c, d],
        [
            torch.randn(10, generator=g, device=DEVICE),
            torch.randint(0, 50, (10,), generator=g, device=DEVICE),
            torch.randperm(15, generator=g, device=DEVICE),
            torch.empty(8, device=DEVICE).bernoulli_(0.5, generator=g),
        ],
    )


def test_generator_state_round_trip():
    g = torch.Generator(device=DEVICE).manual_seed(5)
    torch.randn(3, generator=g, device=DEVICE)
    state = g.get_state()
    first = torch.rand(20, generator=g, device=DEVICE)
    g.set_state(state)
    torch.testing.assert_close(
        torch.rand(20, generator=g, device=DEVICE).cpu(), first.cpu(), **EXACT
    )
    other = torch.Generator(device=DEVICE).manual_seed(6)
    assert not torch.equal(torch.rand(20, generator=other, device=DEVICE).cpu(), first.cpu())


def test_generator_on_other_device():
    g = torch.Generator(device="neuron:1").manual_seed(8)
    assert g.device == torch.device("neuron:1")
    a = torch.randn(4, generator=g, device="neuron:1")
    g.manual_seed(8)
    torch.testing.assert_close(
        torch.randn(4, generator=g, device="neuron:1").cpu(), a.cpu(), **EXACT
    )


def test_cpu_generator_rejected_for_neuron_op():
    with pytest.raises(RuntimeError, match="neuron"):
        torch.randn(3, device=DEVICE, generator=torch.Generator())


def test_neuron_generator_drives_host_draws():
    # Diffusers' randn_tensor draws on the CPU and copies to neuron, with whatever generator
    # the user passed: a neuron generator draws the numbers it would draw on neuron, from a
    # CPU seed's engine, and advances.
    g = torch.Generator(device=DEVICE).manual_seed(11)
    host = torch.randn(2, 5, generator=g, device="cpu")
    assert host.device.type == "cpu"
    again = torch.randn(2, 5, generator=g, device="cpu")
    g.manual_seed(11)
    on_device = torch.randn(2, 5, generator=g, device=DEVICE)
    torch.testing.assert_close(host, on_device.cpu(), **EXACT)
    cpu_reference = torch.randn(2, 5, generator=torch.Generator().manual_seed(11))
    torch.testing.assert_close(host, cpu_reference, **EXACT)
    assert not torch.equal(host, again)
    # Without a neuron generator, a CPU op never reaches the backend: nothing changes there.
    assert torch.rand(3, generator=torch.Generator().manual_seed(1)).device.type == "cpu"


def test_dropout_values_closed_form():
    torch.manual_seed(0)
    p = 0.3
    x = torch.randn(4000, device=DEVICE).requires_grad_(True)
    y = F.dropout(x, p, training=True)
    kept = y != 0
    torch.testing.assert_close(
        y[kept].detach().cpu(), (x[kept] / (1 - p)).detach().cpu(), rtol=1e-6, atol=1e-6
    )
    # Loose statistical bound on the kept fraction (4000 draws: sd ~ 0.007).
    assert 0.65 < kept.float().mean().item() < 0.75
    y.sum().backward()
    expected_grad = kept.float() / (1 - p)
    torch.testing.assert_close(x.grad.cpu(), expected_grad.cpu(), rtol=1e-6, atol=1e-6)


def test_distribution_moments():
    torch.manual_seed(0)
    n = 200_000
    normal = torch.randn(n, device=DEVICE)
    uniform = torch.rand(n, device=DEVICE)
    assert abs(normal.mean().item()) < 0.02
    assert abs(normal.std().item() - 1.0) < 0.02
    assert 0.0 <= uniform.min().item() and uniform.max().item() < 1.0
    assert abs(uniform.mean().item() - 0.5) < 0.01
    perm = torch.randperm(1000, device=DEVICE)
    assert torch.equal(perm.sort().values.cpu(), torch.arange(1000))


def test_fixed_seed_same_in_fresh_process(fresh):
    result = fresh.result()
    assert result.returncode == 0, describe(result)
    a, b, c, d = json.loads(result.stdout.strip().splitlines()[-1])
    torch.manual_seed(1234)
    assert torch.randn(8, device=DEVICE).tolist() == a
    assert torch.randint(0, 1000, (6,), device=DEVICE).tolist() == b
    assert F.dropout(torch.ones(16, device=DEVICE), 0.5).tolist() == c
    assert torch.randn(4, device="neuron:1").tolist() == d


def test_set_rng_state_under_fake_tensor_mode_restores_the_state() -> None:
    """DTensor's sharding propagation (LocalTensor) restores RNG states under FakeTensorMode,
    which refuses ops on real tensors: set_rng_state must not run one (it cloned the state)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    state = torch.neuron.get_rng_state()
    expected = torch.randn(5, device="neuron").cpu()
    with FakeTensorMode():
        torch.neuron.set_rng_state(state)
    assert torch.equal(torch.randn(5, device="neuron").cpu(), expected)
