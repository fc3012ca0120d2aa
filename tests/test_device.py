"""The neuron device: autoloading, torch.neuron / torch.accelerator API, topology from the env."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import describe, start_all

GiB = 1 << 30

# AWS's published per-chip figures: (physical NeuronCores, default LNC, HBM bytes).
CHIPS = {
    "trn1": (2, 1, 32 * GiB),
    "trn2": (8, 2, 96 * GiB),
    "trn3": (8, 2, 144 * GiB),
}

TOPOLOGY_PROBE = """
import json, torch, torchneuron
n = torch.neuron.device_count()
props = [torch.neuron.get_device_properties(i) for i in range(n)]
print(json.dumps({
    "count": n,
    "accelerator_count": torch.accelerator.device_count(),
    "total_memory": [p.total_memory for p in props],
    "lnc": [p.logical_nc_config for p in props],
    "chip": [p.chip for p in props],
    "names": [torch.neuron.get_device_name(i) for i in range(n)],
    "first_core": [p.physical_core_first for p in props],
    "budget": torchneuron._C._host_budget()[1],
}))
"""

ISSUE_SNIPPET = (
    "import torch; x=torch.randn(4,4,device='neuron'); "
    "print((x@x).sum().item(), torch.accelerator.current_accelerator())"
)

AUTOLOADED = """
import sys, torch
assert "torchneuron" in sys.modules, "import torch did not autoload torchneuron"
print(torch.neuron.is_initialized())  # lazy: importing does not initialise the runtime
torch.manual_seed(0)
x = torch.randn(4, 4)
n = x.to('neuron')
print(torch.neuron.is_initialized())
print(repr((n @ n).sum().item()), repr((x @ x).sum().item()))
"""

AUTOLOAD_DISABLED = """
import sys, torch
assert "torchneuron" not in sys.modules
assert not hasattr(torch, "neuron")
try:
    torch.zeros(2, device="neuron")
except RuntimeError as error:
    print("BEFORE-IMPORT-ERROR", str(error).splitlines()[0][:80])
else:
    raise SystemExit("neuron device usable without autoload or import")
import torchneuron
x = torch.arange(4.0, device="neuron")
assert x.device.type == "neuron", x.device
print("AFTER", (x * 2).cpu().tolist(), torch.accelerator.current_accelerator())
"""

BIG = {"TORCHNEURON_HOST_MEMORY_BUDGET": "4TiB"}  # above any core's HBM: capacity = HBM

SCRIPTS = {
    "snippet": (ISSUE_SNIPPET, {}),
    "autoloaded": (AUTOLOADED, {}),
    "autoload_disabled": (AUTOLOAD_DISABLED, {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}),
}
TOPOLOGY_SCRIPTS = {
    "trn1": (TOPOLOGY_PROBE, {"NEURON_PLATFORM_TARGET_OVERRIDE": "trn1", **BIG}),
    "trn2-lnc1": (
        TOPOLOGY_PROBE,
        {"NEURON_PLATFORM_TARGET_OVERRIDE": "trn2", "NEURON_LOGICAL_NC_CONFIG": "1", **BIG},
    ),
    "trn3": (TOPOLOGY_PROBE, {"NEURON_PLATFORM_TARGET_OVERRIDE": "trn3", **BIG}),
    "visible": (TOPOLOGY_PROBE, {"NEURON_RT_VISIBLE_CORES": "0-1,3", **BIG}),
    "budget1g": (TOPOLOGY_PROBE, {"TORCHNEURON_HOST_MEMORY_BUDGET": "1GiB"}),
}


@pytest.fixture(scope="module")
def procs():
    """The autoloading subprocesses, started together so they overlap."""
    return start_all(SCRIPTS)


@pytest.fixture(scope="module")
def topologies():
    """The topology probes, started together so they overlap."""
    return start_all(TOPOLOGY_SCRIPTS)


def ok(procs, key: str):
    result = procs[key].result()
    assert result.returncode == 0, describe(result)
    return result


def topology(procs, key: str) -> dict:
    return json.loads(ok(procs, key).stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------- autoloading


def test_issue_snippet_runs_without_importing_torchneuron(procs):
    value, accelerator = ok(procs, "snippet").stdout.split()
    float(value)  # a real number was printed
    assert accelerator == "neuron"


def test_autoload_is_lazy_and_matches_cpu(procs):
    lines = ok(procs, "autoloaded").stdout.split()
    assert lines[:2] == ["False", "True"]
    on_neuron, on_cpu = (float(v) for v in lines[2:])
    assert on_neuron == pytest.approx(on_cpu, rel=1e-6, abs=1e-6)


def test_autoload_disabled_needs_explicit_import(procs):
    out = ok(procs, "autoload_disabled").stdout
    assert "BEFORE-IMPORT-ERROR" in out
    assert "AFTER [0.0, 2.0, 4.0, 6.0] neuron" in out


# ---------------------------------------------------------------------------- torch.neuron API

DESIGN_NAMES = """is_available device_count current_device set_device device get_device_name
get_device_properties is_bf16_supported synchronize Stream Event current_stream default_stream
set_stream stream manual_seed manual_seed_all seed initial_seed get_rng_state get_rng_state_all
set_rng_state set_rng_state_all empty_cache memory_allocated max_memory_allocated
memory_reserved max_memory_reserved memory_stats memory_summary reset_peak_memory_stats
reset_accumulated_memory_stats get_fallback_ops get_executed_ops clear_op_tracking
get_dynamo_metrics reset_dynamo_metrics""".split()


@pytest.mark.parametrize("name", DESIGN_NAMES)
def test_design_api_name_exists(name):
    assert callable(getattr(torch.neuron, name))


def test_device_module_registered():
    assert torch.get_device_module("neuron") is torch.neuron
    assert torch._C._get_privateuse1_backend_name() == "neuron"


def test_is_available_and_count():
    assert torch.neuron.is_available() is True
    assert torch.neuron.device_count() == 4  # trn2, LNC=2: 8 physical cores / 2


def test_set_device_int_and_torch_device():
    assert torch.neuron.current_device() == 0
    torch.neuron.set_device(2)
    assert torch.neuron.current_device() == 2
    assert torch.empty(3, device="neuron").device == torch.device("neuron", 2)
    torch.neuron.set_device(torch.device("neuron:1"))
    assert torch.neuron.current_device() == 1
    torch.neuron.set_device("neuron:3")
    assert torch.neuron.current_device() == 3
    assert torch.zeros(2, device="neuron").device.index == 3


def test_set_device_rejects_other_device_types():
    with pytest.raises(ValueError, match="neuron"):
        torch.neuron.set_device(torch.device("cpu"))


def test_device_context_manager():
    assert torch.neuron.current_device() == 0
    with torch.neuron.device(1):
        assert torch.neuron.current_device() == 1
        assert torch.ones(2, device="neuron").device == torch.device("neuron:1")
        with torch.neuron.device(torch.device("neuron:2")):
            assert torch.neuron.current_device() == 2
        assert torch.neuron.current_device() == 1
    assert torch.neuron.current_device() == 0


def test_device_context_restores_after_exception():
    with pytest.raises(KeyError):
        with torch.neuron.device(3):
            raise KeyError("boom")
    assert torch.neuron.current_device() == 0


def test_device_guard_from_tensor_ops():
    # An op on neuron:2 tensors runs on neuron:2 whatever the current device is.
    x = torch.arange(6.0).reshape(2, 3).to("neuron:2")
    y = x * 3 + 1
    assert y.device == torch.device("neuron:2")
    torch.testing.assert_close(y.cpu(), torch.arange(6.0).reshape(2, 3) * 3 + 1, rtol=0, atol=0)
    assert torch.neuron.current_device() == 0


def test_get_device_name_and_properties():
    for index in range(torch.neuron.device_count()):
        props = torch.neuron.get_device_properties(index)
        assert isinstance(props.name, str) and props.name
        assert torch.neuron.get_device_name(index) == props.name
        assert "trn2" in props.name
        assert props.total_memory > 0
        assert props.total_memory == min(24 * GiB, torchneuron_budget())
    assert torch.neuron.get_device_name() == torch.neuron.get_device_name(0)
    assert torch.neuron.get_device_properties(torch.device("neuron:1")).name
    assert torch.neuron.get_device_properties("neuron:3").total_memory > 0


def torchneuron_budget() -> int:
    import torchneuron

    return int(torchneuron._C._host_budget()[1])


def test_is_bf16_supported():
    assert torch.neuron.is_bf16_supported() is True


def test_synchronize_accepts_device_forms():
    x = torch.ones(8, device="neuron:1")
    y = x + 1
    torch.neuron.synchronize()
    torch.neuron.synchronize(1)
    torch.neuron.synchronize(torch.device("neuron:1"))
    torch.neuron.synchronize("neuron:1")
    assert y.sum().item() == 16.0


# ---------------------------------------------------------------------------- torch.accelerator


def test_accelerator_resolves_to_neuron():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device("neuron")
    assert torch.accelerator.device_count() == torch.neuron.device_count()
    assert torch.accelerator.current_device_index() == 0
    torch.accelerator.set_device_index(2)
    assert torch.neuron.current_device() == 2
    assert torch.accelerator.current_device_index() == 2
    torch.accelerator.synchronize()
    torch.accelerator.synchronize(2)


def test_accelerator_device_index_context():
    with torch.accelerator.device_index(3):
        assert torch.neuron.current_device() == 3
    assert torch.neuron.current_device() == 0


def test_accelerator_memory_functions_agree():
    x = torch.empty(4096, device="neuron")
    assert torch.accelerator.memory_allocated() == torch.neuron.memory_allocated()
    assert torch.accelerator.memory_reserved() == torch.neuron.memory_reserved()
    assert torch.accelerator.max_memory_allocated() == torch.neuron.max_memory_allocated()
    assert torch.accelerator.memory_allocated() >= x.numel() * 4
    stats = torch.accelerator.memory_stats()
    assert stats["allocated_bytes.all.current"] == torch.neuron.memory_allocated()


def test_accelerator_stream_is_neuron_stream():
    stream = torch.accelerator.current_stream()
    assert stream.device == torch.device("neuron:0")


# ---------------------------------------------------------------------------- generated methods


def test_tensor_neuron_and_is_neuron():
    cpu = torch.arange(5.0)
    assert cpu.is_neuron is False
    moved = cpu.neuron()
    assert moved.is_neuron is True
    assert moved.device == torch.device("neuron:0")
    torch.testing.assert_close(moved.cpu(), cpu, rtol=0, atol=0)
    on_two = cpu.neuron(2)
    assert on_two.device == torch.device("neuron:2")
    torch.testing.assert_close(on_two.cpu(), cpu, rtol=0, atol=0)
    assert moved.neuron() is moved  # already there: no copy, as Tensor.cuda()


def test_module_neuron():
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    reference = [t.clone() for t in module.state_dict().values()]
    returned = module.neuron()
    assert returned is module
    for tensor in list(module.parameters()) + list(module.buffers()):
        assert tensor.device == torch.device("neuron:0")
    for got, want in zip(module.state_dict().values(), reference, strict=True):
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0)
    module.neuron(1)
    assert all(p.device == torch.device("neuron:1") for p in module.parameters())


def test_storage_methods_generated():
    x = torch.arange(3.0, device="neuron")
    storage = x.untyped_storage()
    assert storage.device.type == "neuron"
    assert storage.is_neuron


def test_untyped_storage_neuron_round_trip():
    storage = torch.UntypedStorage(16).neuron()
    assert storage.device == torch.device("neuron:0")
    assert storage.nbytes() == 16


# ---------------------------------------------------------------------------- topology


@pytest.mark.launch_mode_independent
@pytest.mark.parametrize(
    ("key", "chip", "count", "lnc"),
    [("trn1", "trn1", 2, 1), ("trn2-lnc1", "trn2", 8, 1), ("trn3", "trn3", 4, 2)],
)
def test_topology_from_environment(topologies, key, chip, count, lnc):
    info = topology(topologies, key)
    cores, _, hbm = CHIPS[chip]
    assert info["count"] == count
    assert info["accelerator_count"] == count
    assert info["chip"] == [chip] * count
    assert info["lnc"] == [lnc] * count
    assert info["total_memory"] == [hbm * lnc // cores] * count
    assert info["first_core"] == [i * lnc for i in range(count)]
    assert all(chip in name for name in info["names"]), info["names"]


def test_trn2_default_in_process():
    # This process runs with no NEURON_* variables: trn2 with its default LNC=2.
    props = [torch.neuron.get_device_properties(i) for i in range(torch.neuron.device_count())]
    assert len(props) == 4
    assert [p.chip for p in props] == ["trn2"] * 4
    assert [p.logical_nc_config for p in props] == [2] * 4
    assert [p.hbm_bytes for p in props] == [24 * GiB] * 4


@pytest.mark.launch_mode_independent
def test_visible_cores_selects_devices(topologies):
    info = topology(topologies, "visible")
    assert info["count"] == 3
    # Logical cores 0, 1 and 3 of trn2 (LNC=2) start at physical cores 0, 2 and 6.
    assert info["first_core"] == [0, 2, 6]
    assert info["total_memory"] == [24 * GiB] * 3


@pytest.mark.launch_mode_independent
def test_total_memory_capped_by_host_budget(topologies):
    info = topology(topologies, "budget1g")
    assert info["budget"] == GiB
    assert info["total_memory"] == [GiB] * 4


def test_default_budget_caps_in_process_capacity():
    budget = torchneuron_budget()
    assert budget > 0
    free, total = torch.neuron.mem_get_info(0)
    assert total == min(24 * GiB, budget)
    assert total == torch.neuron.get_device_properties(0).total_memory


def test_accelerator_device_capability():
    capability = torch.accelerator.get_device_capability()
    assert capability == torch.neuron.get_device_capability()
    dtypes = set(capability["supported_dtypes"])
    assert {torch.float32, torch.bfloat16, torch.float16, torch.int64} <= dtypes
    assert torch.accelerator.get_device_capability("neuron:1") == capability


def test_default_device_and_device_context():
    torch.set_default_device("neuron")
    try:
        assert torch.randn(3).device == torch.device("neuron:0")
        assert torch.arange(4).device == torch.device("neuron:0")
        assert torch.tensor([1.0, 2.0]).device == torch.device("neuron:0")
    finally:
        torch.set_default_device(None)
    assert torch.zeros(1).device.type == "cpu"
    with torch.device("neuron:1"):
        assert torch.empty(2).device == torch.device("neuron:1")
        assert torch.nn.Linear(2, 2).weight.device == torch.device("neuron:1")
    assert torch.zeros(1).device.type == "cpu"


def test_current_device_is_thread_local():
    import threading

    seen = {}

    def worker():
        torch.neuron.set_device(2)
        seen["index"] = torch.neuron.current_device()
        seen["device"] = torch.empty(1, device="neuron").device

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == {"index": 2, "device": torch.device("neuron:2")}
    assert torch.neuron.current_device() == 0


def test_device_of_tensor():
    with torch.neuron.device_of(torch.ones(1, device="neuron:3")):
        assert torch.neuron.current_device() == 3
    with torch.neuron.device_of(torch.ones(1)):
        assert torch.neuron.current_device() == 0
    assert torch.neuron.current_device() == 0


def test_dynamo_metrics_reset():
    torch.neuron.reset_dynamo_metrics()
    metrics = torch.neuron.get_dynamo_metrics()
    assert metrics["unique_graphs"] == 0
    assert metrics["recompiles"] == 0
    assert metrics["frames_total"] == 0


def test_module_to_moves_parameters_in_place_and_keeps_ties():
    """nn.Module.to keeps each Parameter object (as for CUDA): shared ones stay shared."""
    embed = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = embed.weight  # tied, as in most language models
    model = torch.nn.ModuleList([embed, head])
    before = embed.weight
    values = before.detach().clone()
    model.to("neuron")
    assert embed.weight is before and head.weight is embed.weight
    assert before.device.type == "neuron" and isinstance(before, torch.nn.Parameter)
    torch.testing.assert_close(before.cpu(), values, rtol=0, atol=0)
    model.to("cpu")
    assert head.weight is embed.weight and embed.weight.device.type == "cpu"
    torch.testing.assert_close(embed.weight.detach(), values, rtol=0, atol=0)
