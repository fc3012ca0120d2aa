"""Trainium targets: HBM per logical core and the engines' peaks, from the runtime's profiles."""

from __future__ import annotations

from dataclasses import dataclass

# NeuronLink bandwidth per chip (bytes/s), which the runtime's profiles do not carry. trn3:
# 2.56 TB/s per device (AWS's Trainium3 architecture page); trn2: 1.28 TB/s and trn1: 384 GB/s
# are assumptions not checked against an AWS page here (docs/fidelity.md).
NEURONLINK_BYTES_PER_S = {"trn1": 384e9, "trn2": 1.28e12, "trn3": 2.56e12}


@dataclass(frozen=True)
class Target:
    """One logical core of a chip generation at a logical-core grouping (LNC)."""

    chip: str
    lnc: int
    hbm_bytes: int  # per logical core
    hbm_bytes_per_s: float
    peak_bf16_flops: float
    peak_fp32_flops: float
    link_bytes_per_s: float  # NeuronLink per logical core
    cores_per_chip: int  # logical

    @property
    def name(self) -> str:
        return f"{self.chip} (LNC={self.lnc})"


def _profiles() -> list[dict[str, object]]:
    from ... import _C

    return list(_C._chip_profiles())


def targets() -> list[Target]:
    """Every chip at every grouping it allows: trn1, trn2 LNC=1 and 2, trn3 LNC=1 and 2."""
    found = []
    for p in _profiles():
        physical = int(p["physical_cores_per_chip"])  # type: ignore[arg-type]
        for lnc in range(1, int(p["max_logical_nc_config"]) + 1):  # type: ignore[arg-type]
            cores = physical // lnc
            share = 1.0 / cores
            name = str(p["name"])
            found.append(
                Target(
                    chip=name,
                    lnc=lnc,
                    hbm_bytes=int(p["hbm_bytes_per_chip"]) // cores,  # type: ignore[arg-type]
                    hbm_bytes_per_s=float(p["hbm_bandwidth_bytes_per_s"]) * share,  # type: ignore[arg-type]
                    peak_bf16_flops=float(p["peak_bf16_flops_per_chip"]) * share,  # type: ignore[arg-type]
                    peak_fp32_flops=float(p["peak_fp32_flops_per_chip"]) * share,  # type: ignore[arg-type]
                    link_bytes_per_s=NEURONLINK_BYTES_PER_S.get(name, 0.0) * share,
                    cores_per_chip=cores,
                )
            )
    return found


def find_target(name: str) -> Target:
    """'trn2' (default grouping) or 'trn2:1' / 'trn2:2' (explicit LNC)."""
    chip, _, lnc = name.partition(":")
    profiles = {str(p["name"]): p for p in _profiles()}
    if chip not in profiles:
        raise ValueError(f"unknown chip {chip!r}; known: {', '.join(profiles)}")
    wanted = int(lnc) if lnc else int(profiles[chip]["default_logical_nc_config"])  # type: ignore[arg-type]
    for target in targets():
        if target.chip == chip and target.lnc == wanted:
            return target
    raise ValueError(f"{chip} has no LNC={wanted}")
