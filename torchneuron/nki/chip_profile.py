"""Figures of the chip an NKI kernel targets, from NEURON_PLATFORM_TARGET_OVERRIDE.

SBUF is 128 partitions per NeuronCore; its size per core comes from the runtime's chip
profile (trn1 24 MiB, trn2 28 MiB, trn3 32 MiB). PSUM is 2 MiB per core: 128 partitions of
16 KiB, each eight 2 KiB banks. Engine figures (clock, lanes) feed the cost estimate; they
are the public architecture guide's round numbers, not measurements.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

PARTITIONS = 128
PSUM_BANKS = 8
PSUM_BANK_BYTES = 2048
GEMM_STATIONARY_FMAX = 128
GEMM_MOVING_FMAX = 512
BN_STATS_FMAX = 512

_DEFAULT_TARGET = "trn2"


@dataclass(frozen=True)
class ChipProfile:
    name: str
    sbuf_bytes_per_partition: int
    psum_bytes_per_partition: int
    hbm_bandwidth_bytes_per_s: float
    peak_bf16_flops_per_core: float
    peak_fp32_flops_per_core: float
    engine_clock_hz: float

    @property
    def sbuf_bytes(self) -> int:
        return self.sbuf_bytes_per_partition * PARTITIONS


def target_name() -> str:
    """The chip named by NEURON_PLATFORM_TARGET_OVERRIDE (default trn2)."""
    value = os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE", _DEFAULT_TARGET).strip().lower()
    if value not in ("trn1", "trn2", "trn3"):
        raise ValueError(
            f"NEURON_PLATFORM_TARGET_OVERRIDE={value!r} is not a NKI target; "
            "use one of trn1, trn2, trn3"
        )
    return value


_cache: dict[str, ChipProfile] = {}


def current_profile() -> ChipProfile:
    """The profile of the target chip (read from the runtime's chip table once)."""
    name = target_name()
    cached = _cache.get(name)
    if cached is not None:
        return cached
    from .. import _C

    row = next(p for p in _C._chip_profiles() if p["name"] == name)
    cores = row["physical_cores_per_chip"]
    profile = ChipProfile(
        name=name,
        sbuf_bytes_per_partition=row["sbuf_bytes_per_core"] // PARTITIONS,
        psum_bytes_per_partition=PSUM_BANKS * PSUM_BANK_BYTES,
        hbm_bandwidth_bytes_per_s=row["hbm_bandwidth_bytes_per_s"] / cores,
        peak_bf16_flops_per_core=row["peak_bf16_flops_per_chip"] / cores,
        # trn3's FP32 figure is not published: assume the Tensor Engine's usual 1/4 rate.
        peak_fp32_flops_per_core=(
            row["peak_fp32_flops_per_chip"] or row["peak_bf16_flops_per_chip"] / 4
        )
        / cores,
        engine_clock_hz=1.4e9,
    )
    _cache[name] = profile
    return profile
