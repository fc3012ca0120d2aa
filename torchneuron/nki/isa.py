"""``nki.isa`` (``nisa``): NeuronCore instructions, in both API generations.

Legacy ``neuronxcc.nki.isa`` instructions return a new tile (``nisa.nc_matmul(stationary,
moving)`` returns a PSUM tile); the newer ``nki.isa`` takes the destination first
(``nisa.nc_matmul(dst, stationary, moving, accumulate=...)``). Each instruction here accepts
both (instruction.py says how). The instructions are defined in one module per engine group
and registered there; this module is their namespace, built from the registry, where each
one with two forms also has its destination-first form as ``<name>_into``.
"""

from __future__ import annotations

import enum

# Imported for what they register: the instructions of each engine group.
from . import (  # noqa: F401
    isa_accumulate,
    isa_data_movement,
    isa_elementwise,
    isa_selection,
    isa_statistics_gpsimd_dma,
    isa_tensor_engine,
)
from .control_flow import (  # noqa: F401  (NKI's device scalars and registers)
    NkiScalar,
    VirtualRegister,
    register_alloc,
    register_load,
    register_move,
    register_store,
    scalar_load,
)
from .instruction import INSTRUCTIONS

_ENUMS_AND_QUERIES = [
    "dge_mode", "engine", "get_nc_version", "matmul_perf_mode", "nc_version", "oob_mode",
    "reduce_cmd",
    "unknown_engine", "tensor_engine", "vector_engine", "scalar_engine", "gpsimd_engine",
    "NkiScalar", "VirtualRegister", "register_alloc", "register_load", "register_move",
    "register_store", "scalar_load",
]  # fmt: skip
_INSTRUCTION_NAMES: list[str] = []
for _instruction in INSTRUCTIONS.values():
    globals()[_instruction.name] = _instruction
    _INSTRUCTION_NAMES.append(_instruction.name)
    if _instruction.returns_tile is not None:
        globals()[f"{_instruction.name}_into"] = _instruction.into
        _INSTRUCTION_NAMES.append(f"{_instruction.name}_into")
del _instruction

__all__ = sorted(_ENUMS_AND_QUERIES + _INSTRUCTION_NAMES)


class engine(enum.Enum):  # noqa: N801  (NKI's names)
    unknown = 0
    tensor = 1
    vector = 2
    scalar = 3
    gpsimd = 4
    sync = 5


# The legacy generation's names for the engines (``engine=nisa.vector_engine``).
unknown_engine = engine.unknown
tensor_engine = engine.tensor
vector_engine = engine.vector
scalar_engine = engine.scalar
gpsimd_engine = engine.gpsimd


class reduce_cmd(enum.Enum):  # noqa: N801
    idle = 0
    reset = 1
    reduce = 2
    reset_reduce = 3
    load_reduce = 4


class dge_mode(enum.Enum):  # noqa: N801
    unknown = 0
    none = 1
    swdge = 2
    hwdge = 3


class matmul_perf_mode(enum.Enum):  # noqa: N801
    """nc_matmul's ``perf_mode`` (isa_tensor_engine.py): ``double_row`` is the FP8 mode of
    NeuronCore-v3 and newer, two contraction rows a processing element."""

    none = "none"
    double_row = "double_row"


class oob_mode(enum.Enum):  # noqa: N801
    error = 0
    skip = 1


class nc_version(enum.IntEnum):  # noqa: N801  (ordered: kernels test >= gen3)
    gen2 = 2
    gen3 = 3
    gen4 = 4


def get_nc_version() -> nc_version:
    from .chip_profile import target_name

    return {"trn1": nc_version.gen2, "trn2": nc_version.gen3, "trn3": nc_version.gen4}[
        target_name()
    ]
