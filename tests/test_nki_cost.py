"""nki.estimate / kernel.cost: the roofline estimate against its closed form."""

from __future__ import annotations

import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl


@nki.jit
def _load_matmul_copy_store(x, y):
    out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
    a = nl.load(x)  # HBM -> SBUF, 128x128 float32
    b = nl.load(y)  # HBM -> SBUF, 128x512 float32
    product = nisa.nc_matmul(a, b)  # Tensor Engine, PSUM [128, 512]
    result = nl.copy(product)  # Vector Engine, 512 elements per partition
    nl.store(out, value=result)  # SBUF -> HBM, 128x512 float32
    return out


@pytest.mark.parametrize(
    "target,hbm_bandwidth,cores,fp32_peak",
    [("trn1", 820e9, 2, 47.5e12), ("trn2", 2.9e12, 8, 181e12)],
)
def test_estimate_matches_the_closed_form(monkeypatch, target, hbm_bandwidth, cores, fp32_peak):
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", target)
    x = np.ones((128, 128), np.float32)
    y = np.ones((128, 512), np.float32)
    cost = nki.estimate(_load_matmul_copy_store, x, y)
    clock = 1.4e9
    hbm_bytes = 4 * (128 * 128 + 128 * 512 + 128 * 512)
    flops = 2 * 128 * 128 * 512
    expected = {
        "tensor": max((512 + 64) / clock, flops / (fp32_peak / cores)),
        "vector": 512 / clock,
        "scalar": 0.0,
        "gpsimd": 0.0,
        "dma": hbm_bytes / (hbm_bandwidth / cores),
    }
    assert cost.chip == target
    assert cost.hbm_bytes == hbm_bytes and cost.matmul_flops == flops
    assert cost.instructions == {"dma": 3, "tensor": 1, "vector": 1}
    assert cost.engine_seconds == pytest.approx(expected, rel=1e-12)
    assert cost.estimated_s == pytest.approx(max(expected.values()), rel=1e-12)
    assert cost.serial_s == pytest.approx(sum(expected.values()), rel=1e-12)
    assert cost.bound == max(expected, key=expected.get)
    text = str(cost)
    assert target in text and f"{cost.estimated_s * 1e6:.2f} us" in text
    # By liveness: a and b until the matmul reads them; the result only after they are dead.
    assert cost.sbuf_peak_bytes_per_partition == 4 * (128 + 512)
    assert cost.psum_peak_banks == 1


def test_kernel_cost_method_and_bfloat16_uses_the_bf16_peak(monkeypatch):
    import torch

    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")
    x = torch.ones(128, 128, dtype=torch.bfloat16)
    y = torch.ones(128, 512, dtype=torch.bfloat16)
    cost = _load_matmul_copy_store.cost(x, y)
    flops = 2 * 128 * 128 * 512
    assert cost.engine_seconds["tensor"] == pytest.approx(
        max(576 / 1.4e9, flops / (667e12 / 8)), rel=1e-12
    )
    assert cost.hbm_bytes == 2 * (128 * 128 + 128 * 512) + 4 * 128 * 512


def test_estimate_rejects_a_plain_function():
    with pytest.raises(TypeError, match="@nki.jit"):
        nki.estimate(lambda x: x, np.ones(3))
