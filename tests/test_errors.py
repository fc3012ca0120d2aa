"""Bad input gives PyTorch errors that say what is wrong and what to do."""

from __future__ import annotations

import re
import textwrap

import pytest
import torch
from conftest import describe, start_all

MiB = 1 << 20

OOM_SCRIPT = """
import torch
MiB = 1 << 20
assert torch.neuron.get_device_properties(0).total_memory == 64 * MiB

def oom(nbytes, device="neuron:0"):
    try:
        torch.empty(nbytes, dtype=torch.uint8, device=device)
    except torch.OutOfMemoryError as error:
        assert isinstance(error, RuntimeError)
        return str(error)
    raise SystemExit(f"no OutOfMemoryError for {nbytes} bytes on {device}")

print("EMPTY:", oom(100 * MiB).replace("\\n", " "))
held = torch.ones(40 * MiB, dtype=torch.uint8, device="neuron")
print("HELD:", oom(40 * MiB).replace("\\n", " "))
# The device still works after an OOM, and the failed attempts were counted.
x = torch.arange(1000.0, device="neuron")
assert (x * 2).sum().item() == 999000.0
assert torch.neuron.memory_stats()["num_ooms"] >= 2
del held
# Cached (freed) memory is given back when a new request needs it.
big = torch.empty(50 * MiB, dtype=torch.uint8, device="neuron")
big.fill_(7)
assert big[-1].item() == 7
print("REUSED-CACHE")
del big  # 50 MiB stays cached on neuron:0; no tensor is allocated on any device
try:
    other = torch.empty(30 * MiB, dtype=torch.uint8, device="neuron:1")
    other.fill_(1)
    # (other.sum() would widen uint8 to int64: 240 MiB, beyond this 64 MiB budget)
    print("ACROSS: OK", int(other[0].item()) * other.numel())
except torch.OutOfMemoryError as error:
    print("ACROSS: OutOfMemoryError", str(error).replace("\\n", " "))
"""

BAD_ENV_SCRIPT = """
import torch  # must not fail: the runtime initialises lazily
try:
    torch.zeros(1, device="neuron")
except Exception as error:
    print(type(error).__name__)
    print(error)
    raise SystemExit(3)
print("NO ERROR", torch.neuron.device_count())
"""

BAD_ENVS = {
    "unknown-chip": {"NEURON_PLATFORM_TARGET_OVERRIDE": "trn9"},
    "reversed-range": {"NEURON_RT_VISIBLE_CORES": "3-1"},
    "not-a-number": {"NEURON_RT_VISIBLE_CORES": "a"},
    "duplicate": {"NEURON_RT_VISIBLE_CORES": "0,0"},
    "out-of-range": {"NEURON_RT_VISIBLE_CORES": "0-5"},
    "lnc2-on-trn1": {"NEURON_PLATFORM_TARGET_OVERRIDE": "trn1", "NEURON_LOGICAL_NC_CONFIG": "2"},
}

FORK_SCRIPT = """
import os, torch

def in_child(fn):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            fn()
            message = "NO ERROR"
        except Exception as error:
            message = type(error).__name__ + ": " + str(error)
        os.write(w, message.replace("\\n", " ").encode())
        os._exit(0)
    os.close(w)
    chunks = []
    while chunk := os.read(r, 65536):
        chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return b"".join(chunks).decode()

def uninitialised_child():
    x = torch.arange(4.0, device="neuron")
    assert (x + 1).sum().item() == 10.0

# Forking before the runtime is initialised is fine.
print("BEFORE-INIT:", in_child(uninitialised_child))
x = torch.ones(3, device="neuron")  # initialises the runtime in the parent
print("TENSOR:", in_child(lambda: (torch.ones(3, device="neuron") + 1).cpu()))
print("RANDN:", in_child(lambda: torch.randn(4, device="neuron").sum().item()))
print("SYNC:", in_child(lambda: torch.neuron.synchronize()))
print("PARENT-OK", (x * 2).sum().item())
"""

SPAWN_SCRIPT = """
import multiprocessing as mp
import torch

def work(values, queue):
    x = torch.tensor(values, device="neuron")
    queue.put(((x * 2).sum().item(), str(x.device)))

if __name__ == "__main__":
    torch.ones(1, device="neuron")  # the parent initialised the runtime
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    p = ctx.Process(target=work, args=([1.0, 2.0, 3.5], queue))
    p.start()
    result = queue.get(timeout=100)
    p.join(100)
    print("SPAWN", p.exitcode, result[0], result[1])
"""


def _spawn_command() -> str:
    # spawn re-imports __main__, so the script must be a file; write it from -c.
    body = textwrap.dedent(SPAWN_SCRIPT)
    return (
        "import runpy, tempfile, os\n"
        "d = tempfile.mkdtemp()\n"
        "p = os.path.join(d, 'spawn_main.py')\n"
        f"open(p, 'w').write({body!r})\n"
        "runpy.run_path(p, run_name='__main__')\n"
    )


SCRIPTS = {
    "oom": (OOM_SCRIPT, {"TORCHNEURON_HOST_MEMORY_BUDGET": "64MiB"}),
    "fork": (FORK_SCRIPT, {}),
    "spawn": (_spawn_command(), {}),
}


@pytest.fixture(scope="module")
def procs():
    return start_all(SCRIPTS)


@pytest.fixture(scope="module")
def bad_configurations():
    """A process per bad configuration, started together so they overlap."""
    return start_all({key: (BAD_ENV_SCRIPT, env) for key, env in BAD_ENVS.items()})


def lines_of(procs, key: str, expected_rc: int = 0) -> dict[str, str]:
    result = procs[key].result()
    assert result.returncode == expected_rc, describe(result)
    out = {}
    for line in result.stdout.splitlines():
        tag, _, rest = line.partition(":")
        out[tag] = rest.strip()
    return out


# ---------------------------------------------------------------------------- out of memory


def test_oom_message_names_device_size_capacity(procs):
    message = lines_of(procs, "oom")["EMPTY"]
    assert "neuron:0" in message
    assert "100.00 MiB" in message  # the request
    assert "64.00 MiB" in message  # the capacity
    assert "allocated" in message
    assert "cached" in message
    assert "empty_cache" in message or "TORCHNEURON_HOST_MEMORY_BUDGET" in message


def test_oom_message_reports_what_is_allocated(procs):
    message = lines_of(procs, "oom")["HELD"]
    assert "neuron:0" in message
    assert "40.00 MiB allocated" in message
    assert "64.00 MiB" in message
    assert re.search(r"\bcached\b", message)


def test_device_works_after_oom_and_cache_is_reused(procs):
    result = procs["oom"].result()
    assert result.returncode == 0, describe(result)
    assert "REUSED-CACHE" in result.stdout


def test_cached_memory_on_one_device_does_not_starve_another(procs):
    # The host budget is shared by all devices; memory cached (freed, unused) on neuron:0
    # must be given back when neuron:1 needs it, as a caching allocator does on OOM.
    assert lines_of(procs, "oom")["ACROSS"] == f"OK {30 * MiB}"


# ---------------------------------------------------------------------------- device index


@pytest.mark.parametrize(
    "action",
    [
        lambda: torch.empty(2, device="neuron:7"),
        lambda: torch.arange(3.0).to("neuron:4"),
        lambda: torch.neuron.set_device(9),
        lambda: torch.neuron.get_device_properties(12),
        lambda: torch.neuron.synchronize(5),
        lambda: torch.neuron.memory_allocated(6),
    ],
    ids=["empty", "to", "set_device", "properties", "synchronize", "memory_allocated"],
)
def test_bad_device_index_names_valid_range(action):
    with pytest.raises((IndexError, RuntimeError, ValueError)) as info:
        action()
    message = str(info.value)
    assert re.search(r"\b0 ?(to|-|\.\.) ?3\b", message), message
    assert "neuron" in message
    assert torch.neuron.current_device() == 0  # a failed selection changes nothing


# ---------------------------------------------------------------------------- configuration


@pytest.mark.launch_mode_independent
@pytest.mark.parametrize(
    ("key", "variable", "value"),
    [
        ("unknown-chip", "NEURON_PLATFORM_TARGET_OVERRIDE", "trn9"),
        ("reversed-range", "NEURON_RT_VISIBLE_CORES", "3-1"),
        ("not-a-number", "NEURON_RT_VISIBLE_CORES", "a"),
        ("duplicate", "NEURON_RT_VISIBLE_CORES", "0,0"),
        ("out-of-range", "NEURON_RT_VISIBLE_CORES", "0-5"),
        ("lnc2-on-trn1", "NEURON_LOGICAL_NC_CONFIG", "2"),
    ],
)
def test_bad_configuration_names_the_variable(bad_configurations, key, variable, value):
    result = bad_configurations[key].result()
    assert result.returncode == 3, describe(result)
    kind, message = result.stdout.split("\n", 1)
    assert kind == "RuntimeError", describe(result)
    assert variable in message
    assert value in message


@pytest.mark.launch_mode_independent
def test_unknown_chip_lists_known_profiles(bad_configurations):
    message = bad_configurations["unknown-chip"].result().stdout
    for name in ("trn1", "trn2", "trn3"):
        assert name in message


@pytest.mark.launch_mode_independent
def test_out_of_range_cores_states_valid_range(bad_configurations):
    message = bad_configurations["out-of-range"].result().stdout
    assert "0-3" in message or "0 to 3" in message


@pytest.mark.launch_mode_independent
def test_lnc_error_names_the_chip(bad_configurations):
    assert "trn1" in bad_configurations["lnc2-on-trn1"].result().stdout


# ---------------------------------------------------------------------------- cross-device ops


def _n(*shape: int) -> torch.Tensor:
    return torch.randn(*shape).to("neuron")


MIXED = {
    "add": lambda: _n(3, 4) + torch.randn(3, 4),
    "radd": lambda: torch.randn(3, 4) + _n(3, 4),
    "mul_": lambda: _n(3, 4).mul_(torch.randn(3, 4)),
    "matmul": lambda: _n(3, 4) @ torch.randn(4, 2),
    "cat": lambda: torch.cat([_n(2, 3), torch.randn(2, 3)]),
    "stack": lambda: torch.stack([torch.randn(2, 3), _n(2, 3)]),
    "index_select": lambda: _n(5, 3).index_select(0, torch.tensor([0, 2])),
    "where-cond": lambda: torch.where(torch.randn(3) > 0, _n(3), _n(3)),
    "where-other": lambda: torch.where(_n(3) > 0, _n(3), torch.randn(3)),
    "linear": lambda: torch.nn.functional.linear(_n(2, 4), torch.randn(3, 4)),
    "gather": lambda: _n(3, 4).gather(1, torch.zeros(3, 1, dtype=torch.long)),
    "copy-out": lambda: torch.add(_n(3), _n(3), out=torch.empty(3)),
}


@pytest.mark.parametrize("name", list(MIXED))
def test_mixing_cpu_and_neuron_tensors_fails(name):
    with pytest.raises(RuntimeError, match="same device") as info:
        MIXED[name]()
    message = str(info.value)
    assert "cpu" in message.lower()
    assert "neuron" in message


def test_mixing_neuron_devices_fails():
    with pytest.raises(RuntimeError, match="same device") as info:
        _ = torch.ones(3, device="neuron:0") + torch.ones(3, device="neuron:1")
    assert "neuron:0" in str(info.value) and "neuron:1" in str(info.value)


def test_zero_dim_cpu_tensors_are_allowed():
    cpu = torch.randn(3, 4)
    x = cpu.to("neuron")
    scalar = torch.tensor(2.5)
    torch.testing.assert_close((x + scalar).cpu(), cpu + scalar, rtol=0, atol=0)
    torch.testing.assert_close((scalar * x).cpu(), scalar * cpu, rtol=0, atol=0)
    torch.testing.assert_close(
        torch.where(x > 0, x, torch.tensor(0.0)).cpu(),
        torch.where(cpu > 0, cpu, torch.tensor(0.0)),
        rtol=0,
        atol=0,
    )
    y = x.clone()
    y.add_(torch.tensor(1.0))
    torch.testing.assert_close(y.cpu(), cpu + 1, rtol=0, atol=0)
    assert (x + scalar).device == torch.device("neuron:0")


def test_cpu_index_tensors_are_allowed_in_indexing():
    cpu = torch.randn(5, 3)
    x = cpu.to("neuron")
    index = torch.tensor([4, 0, 2])
    torch.testing.assert_close(x[index].cpu(), cpu[index], rtol=0, atol=0)
    y = x.clone()
    y[index] = 0.0
    expected = cpu.clone()
    expected[index] = 0.0
    torch.testing.assert_close(y.cpu(), expected, rtol=0, atol=0)


# ---------------------------------------------------------------------------- processes


def test_fork_before_init_is_fine(procs):
    assert lines_of(procs, "fork")["BEFORE-INIT"] == "NO ERROR"


@pytest.mark.parametrize("use", ["TENSOR", "RANDN", "SYNC"])
def test_fork_after_init_recommends_spawn(procs, use):
    out = lines_of(procs, "fork")
    message = out[use]
    assert message != "NO ERROR", f"{use}: a forked child used the device without an error"
    assert message.startswith("RuntimeError"), message
    assert "spawn" in message
    assert "fork" in message


def test_parent_unaffected_by_forked_child(procs):
    result = procs["fork"].result()
    assert result.returncode == 0, describe(result)
    assert "PARENT-OK 6.0" in result.stdout.splitlines()


def test_spawn_works(procs):
    result = procs["spawn"].result()
    assert result.returncode == 0, describe(result)
    assert result.stdout.split() == ["SPAWN", "0", "13.0", "neuron:0"]
