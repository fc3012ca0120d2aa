"""AWS's simulator switches on torchneuron.nki kernels: NKI_SIMULATOR=1 runs every call of
an ``nki.jit`` kernel in the simulator (here, the reference interpreter) instead of the
compiled path, with no change to the calling code; NKI_PRECISE_FP=0 keeps low-precision
values unrounded inside a simulated kernel (a setting of the simulator, not of the hardware,
so the compiled path still rounds)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl


def _counting_kernel() -> tuple[object, list[int]]:
    traces = [0]

    @nki.jit
    def double(a):
        traces[0] += 1  # Python in the kernel body runs only when the kernel is traced
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.multiply(nl.load(a), 2.0))
        return out

    return double, traces


@pytest.mark.parametrize("device", ["cpu", "neuron"])
def test_simulator_switch_runs_every_call_in_the_interpreter(monkeypatch, device) -> None:
    x = torch.randn(128, 64, device=device)
    double, traces = _counting_kernel()
    for _ in range(3):
        torch.testing.assert_close(double(x), 2 * x)
    assert traces == [1]  # compiled: traced once, then the compiled program runs

    monkeypatch.setenv("NKI_SIMULATOR", "1")
    double, traces = _counting_kernel()
    for _ in range(3):
        got = double(x)
        assert got.device == x.device
        torch.testing.assert_close(got, 2 * x)
    assert traces == [3]

    monkeypatch.setenv("NKI_SIMULATOR", "0")
    double, traces = _counting_kernel()
    double(x), double(x)
    assert traces == [1]


def test_simulator_switch_refuses_a_conflict_and_other_values(monkeypatch) -> None:
    double, _ = _counting_kernel()
    x = np.ones((128, 4), np.float32)
    monkeypatch.setenv("NKI_SIMULATOR", "1")
    monkeypatch.setenv("TORCHNEURON_NKI_EXECUTION", "interpret")
    np.testing.assert_array_equal(double(x), 2 * x)  # both ask for the interpreter
    monkeypatch.setenv("TORCHNEURON_NKI_EXECUTION", "compiled")
    with pytest.raises(ValueError, match="NKI_SIMULATOR=1 .* TORCHNEURON_NKI_EXECUTION=compiled"):
        double(x)
    monkeypatch.delenv("TORCHNEURON_NKI_EXECUTION")
    monkeypatch.setenv("NKI_SIMULATOR", "yes")
    with pytest.raises(ValueError, match="NKI_SIMULATOR='yes': use 1 or 0"):
        double(x)


@nki.jit
def _bf16_increment(a, b):
    """(a + b) held in a bfloat16 tile, minus a, in float32: b if the sum is not rounded."""
    out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    total = nl.add(nl.load(a), nl.load(b), dtype=nl.bfloat16)
    nl.store(out, value=nl.subtract(total, nl.load(a), dtype=nl.float32))
    return out


def test_precise_fp_off_keeps_low_precision_values_unrounded_in_the_simulator(
    monkeypatch,
) -> None:
    a = np.ones((128, 8), np.float32)
    b = np.full((128, 8), 2.0**-10, np.float32)  # below bfloat16's resolution at 1.0
    np.testing.assert_array_equal(_bf16_increment.interpret(a, b), 0.0)  # precise: default
    monkeypatch.setenv("NKI_PRECISE_FP", "1")
    np.testing.assert_array_equal(nki.simulate(_bf16_increment)(a, b), 0.0)

    monkeypatch.setenv("NKI_PRECISE_FP", "0")
    np.testing.assert_array_equal(nki.simulate(_bf16_increment)(a, b), b)
    np.testing.assert_array_equal(_bf16_increment.interpret(a, b), b)
    _bf16_increment(a, b)  # traced for the compiled path, which rounds as the hardware does
    np.testing.assert_array_equal(_bf16_increment(a, b), 0.0)

    monkeypatch.setenv("NKI_PRECISE_FP", "off")
    with pytest.raises(ValueError, match="NKI_PRECISE_FP='off': use 1 or 0"):
        _bf16_increment.interpret(a, b)


@nki.jit
def _bf16_activation_stored(x):
    """An activation written to a bfloat16 tile, then stored to a float32 output (AWS's
    activation example, which reads the stored values back)."""
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nl.store(out, value=nisa.activation(op=np.square, data=nl.load(x), dtype=nl.bfloat16))
    return out


def test_a_bfloat16_tile_stored_to_float32_is_rounded_in_the_compiled_path_too() -> None:
    """The compiled path used to write the activation straight into the float32 output (a
    store of a tile written once becomes its producer's write) and skipped the tile's
    rounding: 0.4% apart from the interpreter and the hardware."""
    x = np.random.default_rng(1).uniform(1, 300, size=(128, 64)).astype(np.float32)
    expected = np.square(x).astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(_bf16_activation_stored.interpret(x), expected)
    _bf16_activation_stored(x)  # traced
    np.testing.assert_array_equal(_bf16_activation_stored(x), expected)
