"""torch.save / torch.load of neuron tensors and module state."""

from __future__ import annotations

import io

import pytest
import torch

EXACT = {"rtol": 0, "atol": 0}


def round_trip(obj: object, **load_kwargs: object) -> object:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, **load_kwargs)


def test_tensor_loads_back_on_neuron():
    cpu = torch.randn(3, 5)
    loaded = round_trip(cpu.to("neuron"))
    assert loaded.device == torch.device("neuron:0")
    torch.testing.assert_close(loaded.cpu(), cpu, **EXACT)


def test_tensor_keeps_its_device_index():
    cpu = torch.arange(10.0)
    loaded = round_trip({"a": cpu.to("neuron:2"), "b": cpu.to("neuron:1")})
    assert loaded["a"].device == torch.device("neuron:2")
    assert loaded["b"].device == torch.device("neuron:1")
    torch.testing.assert_close(loaded["a"].cpu(), cpu, **EXACT)


@pytest.mark.parametrize(
    ("map_location", "expected"),
    [
        ("cpu", torch.device("cpu")),
        ("neuron", torch.device("neuron:0")),
        ("neuron:3", torch.device("neuron:3")),
        (torch.device("neuron:1"), torch.device("neuron:1")),
    ],
)
def test_map_location(map_location, expected):
    cpu = torch.randn(4, 4)
    loaded = round_trip(cpu.to("neuron:2"), map_location=map_location)
    assert loaded.device == expected
    torch.testing.assert_close(loaded.cpu(), cpu, **EXACT)


def test_cpu_tensor_mapped_to_neuron():
    cpu = torch.randn(6)
    loaded = round_trip(cpu, map_location="neuron")
    assert loaded.device == torch.device("neuron:0")
    torch.testing.assert_close(loaded.cpu(), cpu, **EXACT)


def test_map_location_dict_and_callable():
    cpu = torch.randn(5)
    loaded = round_trip(cpu.to("neuron:1"), map_location={"neuron:1": "neuron:0"})
    assert loaded.device == torch.device("neuron:0")
    loaded = round_trip(cpu.to("neuron:1"), map_location=lambda storage, loc: storage)
    assert loaded.device.type == "cpu"
    torch.testing.assert_close(loaded, cpu, **EXACT)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool]
)
def test_dtypes_round_trip(dtype):
    cpu = (torch.randn(7, 3) * 10).to(dtype)
    loaded = round_trip(cpu.to("neuron"))
    assert loaded.dtype == dtype
    torch.testing.assert_close(loaded.cpu(), cpu, **EXACT)


def test_views_keep_sharing_storage():
    base = torch.arange(12.0, device="neuron").view(3, 4)
    loaded = round_trip({"base": base, "row": base[1], "t": base.t()})
    assert loaded["row"].untyped_storage().data_ptr() == loaded["base"].untyped_storage().data_ptr()
    assert loaded["t"].stride() == (1, 4)
    loaded["base"][1, 0] = -1.0
    assert loaded["row"][0].item() == -1.0
    torch.testing.assert_close(
        loaded["t"].cpu(),
        torch.arange(12.0)
        .view(3, 4)
        .t()
        .index_put((torch.tensor([0]), torch.tensor([1])), torch.tensor([-1.0])),
        **EXACT,
    )


def test_weights_only_load():
    cpu = torch.randn(3)
    loaded = round_trip({"w": cpu.to("neuron")}, weights_only=True)
    assert loaded["w"].device == torch.device("neuron:0")
    torch.testing.assert_close(loaded["w"].cpu(), cpu, **EXACT)


def test_module_state_dict_round_trip(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 3)
    ).to("neuron")
    model.train()
    model(torch.randn(5, 6, device="neuron"))  # update BatchNorm's running statistics
    model.eval()
    path = tmp_path / "model.pt"
    torch.save(model.state_dict(), path)

    x = torch.randn(4, 6)
    expected = model(x.to("neuron")).detach().cpu()

    fresh = (
        torch.nn.Sequential(
            torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 3)
        )
        .to("neuron")
        .eval()
    )
    state = torch.load(path)
    for name, tensor in state.items():
        assert tensor.device == torch.device("neuron:0"), name
    fresh.load_state_dict(state)
    torch.testing.assert_close(fresh(x.to("neuron")).detach().cpu(), expected, **EXACT)

    cpu_model = torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 3)
    ).eval()
    cpu_state = torch.load(path, map_location="cpu")
    assert all(t.device.type == "cpu" for t in cpu_state.values())
    cpu_model.load_state_dict(cpu_state)
    torch.testing.assert_close(cpu_model(x).detach(), expected, rtol=1e-5, atol=1e-5)
    for (name, a), b in zip(model.state_dict().items(), cpu_state.values(), strict=True):
        torch.testing.assert_close(a.cpu(), b, **EXACT, msg=name)


def test_optimizer_state_round_trip():
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.randn(4, device="neuron"))
    opt = torch.optim.Adam([param], lr=0.1)
    param.sum().backward()
    opt.step()
    loaded = round_trip(opt.state_dict())
    exp_avg = loaded["state"][0]["exp_avg"]
    assert exp_avg.device == torch.device("neuron:0")
    torch.testing.assert_close(
        exp_avg.cpu(), opt.state_dict()["state"][0]["exp_avg"].cpu(), **EXACT
    )
