"""The device spec for the Hugging Face test suites (torchneuron.device.hf_test_device).

The libraries import the spec in their own process, by file name from the current directory,
so the checks run Python in a subprocess whose working directory holds the written shim.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import torch
from conftest import SUBPROCESS_TIMEOUT, clean_env, describe, run_python, tiny_llama_config

from torchneuron.device import hf_test_device

SPEC_ENV = {
    "TRANSFORMERS_TEST_DEVICE": "neuron",
    "TRANSFORMERS_TEST_DEVICE_SPEC": hf_test_device.SHIM_FILE_NAME,
    "DIFFUSERS_TEST_DEVICE": "neuron",
    "DIFFUSERS_TEST_DEVICE_SPEC": hf_test_device.SHIM_FILE_NAME,
    "HF_HUB_OFFLINE": "1",
}

# For each library: seed through its backend_manual_seed and draw on its torch_device, then
# repeat with torch.neuron.manual_seed: equal draws mean the library's seeding reached the neuron
# generator. The CPU generator, seeded differently first, must keep its seed (torch.manual_seed,
# the libraries' fallback for devices they do not know, would reseed it).
LIBRARIES_PROBE = """
import importlib, json, torch

def probe(module):
    lib = importlib.import_module(module)
    out = {"torch_device": repr(lib.torch_device), "spec_name": lib.device_spec_module.DEVICE_NAME}
    torch.manual_seed(99)
    lib.backend_manual_seed(lib.torch_device, 1234)
    out["seeds"] = [torch.neuron.initial_seed(), torch.initial_seed()]
    via_library = torch.randn(64, device=lib.torch_device)
    torch.neuron.manual_seed(1234)
    via_neuron = torch.randn(64, device="neuron")
    out["draw_device"] = str(via_library.device)
    out["seed_reaches_neuron"] = torch.equal(via_library.cpu(), via_neuron.cpu())
    out["device_count"] = lib.backend_device_count(lib.torch_device)
    if module.startswith("diffusers"):
        lib.backend_reset_peak_memory_stats(lib.torch_device)
        block = torch.empty(3 << 20, dtype=torch.uint8, device="neuron")
        out["peak_after_3MiB"] = lib.backend_max_memory_allocated(lib.torch_device)
        out["neuron_peak"] = torch.neuron.max_memory_allocated()
    return out

libraries = ["transformers.testing_utils", "diffusers.utils.testing_utils"]
print("RESULT" + json.dumps({m: probe(m) for m in libraries}))
"""


@pytest.fixture(scope="module")
def library_probe(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, object]]:
    """Both libraries' testing utilities, imported in a process run from the shim's directory."""
    directory = tmp_path_factory.mktemp("hf_suite_root")
    hf_test_device.write_shim(directory)
    result = run_python(LIBRARIES_PROBE, env=SPEC_ENV, cwd=str(directory))
    assert result.returncode == 0, describe(result)
    line = next(x for x in result.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line[len("RESULT") :])


@pytest.mark.parametrize("module", ["transformers.testing_utils", "diffusers.utils.testing_utils"])
def test_library_testing_utils_run_on_neuron(library_probe, module):
    out = library_probe[module]
    assert out["torch_device"] == repr("neuron")
    assert out["spec_name"] == "neuron"
    assert out["seed_reaches_neuron"] is True
    assert out["seeds"] == [1234, 99]
    assert out["draw_device"] == "neuron:0"
    assert out["device_count"] == torch.neuron.device_count()


def test_diffusers_memory_statistics_reach_neuron(library_probe):
    out = library_probe["diffusers.utils.testing_utils"]
    assert out["peak_after_3MiB"] == out["neuron_peak"] >= 3 << 20


def test_spec_exports_every_attribute_the_libraries_read():
    for name in hf_test_device.SPEC_ATTRIBUTES:
        assert hasattr(hf_test_device, name), name
    assert hf_test_device.MANUAL_SEED_FN is torch.neuron.manual_seed
    assert hf_test_device.DEVICE_COUNT_FN() == torch.neuron.device_count()


def test_command_writes_shim_and_prints_environment(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "torchneuron.device.hf_test_device", str(tmp_path)],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
    )
    assert result.returncode == 0, describe(result)
    shim = tmp_path / hf_test_device.SHIM_FILE_NAME
    assert shim.read_text() == hf_test_device.shim_source()
    exports = [x for x in result.stdout.splitlines() if not x.startswith("#")]
    assert exports == hf_test_device.environment_lines()
    # Running it again rewrites its own file.
    assert hf_test_device.write_shim(tmp_path) == shim


def test_command_keeps_a_foreign_file_and_rejects_a_missing_directory(tmp_path):
    foreign = tmp_path / hf_test_device.SHIM_FILE_NAME
    foreign.write_text("DEVICE_NAME = 'other'\n")
    with pytest.raises(FileExistsError, match="--overwrite"):
        hf_test_device.write_shim(tmp_path)
    assert foreign.read_text() == "DEVICE_NAME = 'other'\n"
    hf_test_device.write_shim(tmp_path, overwrite=True)
    assert foreign.read_text() == hf_test_device.shim_source()
    with pytest.raises(NotADirectoryError, match="directory pytest will run from"):
        hf_test_device.write_shim(tmp_path / "missing")
    with pytest.raises(SystemExit) as exit_info:
        hf_test_device.main([str(tmp_path / "missing")])
    assert exit_info.value.code == 2


def test_integer_device_from_diffusers_autodetection_is_neuron():
    # Without DIFFUSERS_TEST_DEVICE, diffusers' tests use torch.neuron.current_device() (an int).
    index = torch.neuron.current_device()
    assert isinstance(index, int)
    assert torch.device(index) == torch.device("neuron", index)
    assert torch.zeros(2).to(index).device == torch.device("neuron", index)


# Softmax and SiLU run our own kernels on neuron for float32 and bfloat16 (rounding a few
# float32 ulps, or one bfloat16 step, away from the CPU's); float16 runs the CPU's kernels.
NATIVE_ROUNDING = {
    torch.float32: {"rtol": 1e-5, "atol": 1e-5},
    torch.float16: {"rtol": 0.0, "atol": 0.0},
    torch.bfloat16: {"rtol": 2**-7, "atol": 2e-2},
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_eager_and_sdpa_attention_match_cpu(dtype):
    """Why Transformers' eager-vs-SDPA test needs no neuron tolerances of its own: both paths
    give the CPU's values within the native kernels' rounding, so their difference on neuron
    is the CPU's within that rounding (the CPU's entry admits far larger gaps)."""
    from transformers import LlamaModel

    torch.manual_seed(0)
    ids = torch.randint(3, 64, (4, 7))
    mask = torch.ones_like(ids)
    mask[-1, :2] = 0  # left padding in the last row, as the library's test does
    outputs = {}
    for impl in ("eager", "sdpa"):
        torch.manual_seed(0)
        config = tiny_llama_config(attn_implementation=impl)
        model = LlamaModel(config).to(dtype).eval()
        for device in ("cpu", "neuron"):
            with torch.no_grad():
                hidden = copy.deepcopy(model).to(device)(
                    ids.to(device), attention_mask=mask.to(device)
                )
            outputs[impl, device] = hidden.last_hidden_state.cpu()
    tolerance = NATIVE_ROUNDING[dtype]
    for impl in ("eager", "sdpa"):
        torch.testing.assert_close(outputs[impl, "neuron"], outputs[impl, "cpu"], **tolerance)
    keep = mask.bool()
    gap = {
        d: (outputs["eager", d] - outputs["sdpa", d])[keep].abs().max() for d in ("cpu", "neuron")
    }
    torch.testing.assert_close(gap["neuron"], gap["cpu"], rtol=0.0, atol=2 * tolerance["atol"])
