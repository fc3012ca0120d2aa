"""Trainium and Inferentia2 instances as the analytic projection sees them, every figure from
AWS's documentation (aws-neuron/aws-neuron-sdk at commit 81ce03ae26, the Neuron 2.32 docs
sources; paths below are in that repository).

Per-core peaks are the NKI architecture guide's (TensorE, VectorE, ScalarE), chip and instance
figures the architecture pages'. Where AWS's own figures disagree (docs/fidelity.md lists the
cases) the one used is named.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class Instance:
    """One instance type: its NeuronCores (logical, as the runtime numbers them) and links."""

    name: str
    cores: int  # logical NeuronCores per instance
    matmul_bf16_flops: float  # TensorE peak per logical core, BF16/FP16 inputs
    vector_elements_per_s: float  # VectorE elements per second per logical core (one input)
    scalar_elements_per_s: float  # ScalarE (activation functions) elements per second per core
    hbm_bytes_per_s: float  # per logical core
    link_bytes_per_s: float  # NeuronLink per logical core (chip figure / cores per chip)
    network_bytes_per_s: float  # EFA per instance
    hop_latency_s: float  # one step of a ring inside the instance
    network_latency_s: float  # one step across instances
    sbuf_bytes: int  # on-chip SBUF per logical core


# NeuronCore-v2 (trn1, inf2): TensorE 128x128 at 2.8 GHz, "up to 92 TFLOPS" BF16
# (nki/guides/architecture/trainium_inferentia2_arch.rst:99,103); VectorE 128 lanes at
# 1.12 GHz, ScalarE 128 lanes at 1.4 GHz, about one element per lane per cycle (same file,
# :65-71); HBM 820 GiB/s per chip, 2 cores (about-neuron/arch/neuron-hardware/trainium.rst:24);
# SBUF 24 MiB (trainium_inferentia2_arch.rst:76).
_NC_V2 = dict(
    sbuf_bytes=24 << 20,
    matmul_bf16_flops=92e12,
    vector_elements_per_s=128 * 1.12e9,
    scalar_elements_per_s=128 * 1.4e9,
    hbm_bytes_per_s=820 * GIB / 2,
    # Per-hop latency inside an instance "about 1-2 us"
    # (neuron-runtime/explore/intranode-collective-comm.rst:61).
    hop_latency_s=1.5e-6,
    # Smallest HBM-to-HBM packet between servers: 15 us (neuron-runtime/about/collectives.rst:114).
    network_latency_s=15e-6,
)

INSTANCES = {
    # 16 chips, 32 cores, NeuronLink-v2 384 GiB/s per chip, EFA 800 Gbps
    # (general/arch/neuron-hardware/trn1-arch.rst at 60224f42, the table with its link header).
    "trn1.32xlarge": Instance(
        "trn1.32xlarge", 32, **_NC_V2, link_bytes_per_s=384 * GIB / 2, network_bytes_per_s=100e9
    ),
    # The same chips with EFA 1600 Gbps and NeuronLink-v2 768 GiB/s per chip.
    "trn1n.32xlarge": Instance(
        "trn1n.32xlarge", 32, **_NC_V2, link_bytes_per_s=768 * GIB / 2, network_bytes_per_s=200e9
    ),
    # 12 Inferentia2 chips, 24 cores, NeuronLink-v2 192 GiB/s per chip
    # (about-neuron/arch/neuron-hardware/inf2-arch.rst:62-70).
    "inf2.48xlarge": Instance(
        "inf2.48xlarge", 24, **_NC_V2, link_bytes_per_s=192 * GIB / 2, network_bytes_per_s=12.5e9
    ),
    # NeuronCore-v3 at LNC=2 (the default): 4 logical cores per chip, 64 per instance, each two
    # physical cores: TensorE 2 x 79 BF16 TFLOPS, VectorE 2 x 1.0 TFLOPS,
    # ScalarE 2 x 128 elements/cycle at 1.2 GHz (nki/guides/architecture/trainium2_arch.rst:54-71,
    # about-neuron/arch/neuron-hardware/neuron-core-v3.rst:42-49); HBM 2.9 TB/s per chip
    # (trainium2.rst:30); NeuronLink-v3 1.28 TB/s per chip (trainium2.rst:37); EFA 3,200 Gbps
    # (trn2-arch.rst:68-105); SBUF 28 MiB per physical core (trainium2_arch.rst:39).
    "trn2.48xlarge": Instance(
        "trn2.48xlarge",
        64,
        matmul_bf16_flops=2 * 79e12,
        vector_elements_per_s=2 * 1.0e12,
        scalar_elements_per_s=2 * 128 * 1.2e9,
        hbm_bytes_per_s=2.9e12 / 4,
        link_bytes_per_s=1.28e12 / 4,
        network_bytes_per_s=400e9,
        hop_latency_s=1.5e-6,
        network_latency_s=15e-6,
        sbuf_bytes=2 * (28 << 20),
    ),
}


def find_instance(name: str) -> Instance:
    key = name.lower()
    if key not in INSTANCES:
        raise ValueError(f"unknown instance {name!r}; known: {', '.join(INSTANCES)}")
    return INSTANCES[key]
