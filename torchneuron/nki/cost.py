"""What a traced kernel would cost on the target chip: a roofline estimate from its recorded
usage and the chip profile's figures (not a cycle-accurate simulation).

Per engine, from what the trace recorded (:class:`.interpreter.Usage`):

* Tensor Engine: ``max(cycles / clock, matmul FLOPs / peak)`` — each nc_matmul streams its
  moving free size one column per cycle plus a fixed 64-cycle issue cost; the FLOP bound
  uses the profile's per-core peak (BF16, or FP32 when an operand is float32);
* Vector / Scalar / GpSimd: one element per partition per cycle (the instruction's free
  size) at the engine clock;
* DMA: bytes with an HBM side over the core's share of HBM bandwidth.

Engines run concurrently on a NeuronCore, so the estimate is the busiest engine's time
(perfect overlap, a lower bound); ``serial_s`` (no overlap) is the upper bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .chip_profile import ChipProfile, current_profile
from .interpreter import Usage

_COMPUTE = ("vector", "scalar", "gpsimd")


@dataclass(frozen=True)
class CostEstimate:
    """A kernel's estimated cost on one NeuronCore of `chip`."""

    chip: str
    instructions: dict[str, int]
    hbm_bytes: int
    dma_bytes: int
    matmul_flops: int
    sbuf_peak_bytes_per_partition: int
    psum_peak_banks: int
    engine_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def estimated_s(self) -> float:
        """Busiest engine (engines overlapping perfectly)."""
        return max(self.engine_seconds.values(), default=0.0)

    @property
    def serial_s(self) -> float:
        """All engines one after another (no overlap)."""
        return sum(self.engine_seconds.values())

    @property
    def bound(self) -> str:
        """The engine that bounds the estimate."""
        if not self.engine_seconds:
            return "none"
        return max(self.engine_seconds, key=lambda e: self.engine_seconds[e])

    def __str__(self) -> str:
        engines = ", ".join(
            f"{name} {seconds * 1e6:.2f} us" for name, seconds in self.engine_seconds.items()
        )
        counts = ", ".join(f"{name} {n}" for name, n in sorted(self.instructions.items()))
        return (
            f"NKI kernel on one {self.chip} NeuronCore: ~{self.estimated_s * 1e6:.2f} us "
            f"({self.bound}-bound; {self.serial_s * 1e6:.2f} us without overlap)\n"
            f"  engines: {engines}\n"
            f"  instructions: {counts}\n"
            f"  HBM<->chip {self.hbm_bytes} bytes, all DMA {self.dma_bytes} bytes, "
            f"matmul {self.matmul_flops} FLOPs\n"
            f"  peaks: SBUF {self.sbuf_peak_bytes_per_partition} bytes/partition, "
            f"PSUM {self.psum_peak_banks} banks"
        )


def from_usage(usage: Usage, profile: ChipProfile | None = None) -> CostEstimate:
    """The estimate for a recorded usage on `profile` (default: the target chip)."""
    chip = profile or current_profile()
    clock = chip.engine_clock_hz
    cycles = usage.engine_cycles
    tensor = max(
        cycles.get("tensor", 0) / clock,
        usage.matmul_flops.get("fp32", 0) / chip.peak_fp32_flops_per_core
        + usage.matmul_flops.get("bf16", 0) / chip.peak_bf16_flops_per_core
        # FP8 double-row: two products a processing element per cycle
        + usage.matmul_flops.get("fp8_double_row", 0) / (2 * chip.peak_bf16_flops_per_core),
    )
    seconds = {"tensor": tensor}
    for engine in _COMPUTE:
        seconds[engine] = cycles.get(engine, 0) / clock
    seconds["dma"] = usage.hbm_bytes / chip.hbm_bandwidth_bytes_per_s
    return CostEstimate(
        chip=chip.name,
        instructions=dict(usage.instructions),
        hbm_bytes=usage.hbm_bytes,
        dma_bytes=usage.dma_bytes,
        matmul_flops=sum(usage.matmul_flops.values()),
        sbuf_peak_bytes_per_partition=usage.sbuf_peak_bytes_per_partition,
        psum_peak_banks=usage.psum_peak_banks,
        engine_seconds=seconds,
    )
