"""``nki.isa`` (``nisa``): NeuronCore instructions, in both API generations.

Legacy ``neuronxcc.nki.isa`` instructions return a new tile (``nisa.nc_matmul(stationary,
moving)`` returns a PSUM tile); the newer ``nki.isa`` takes the destination first
(``nisa.nc_matmul(dst, stationary, moving, accumulate=...)``). Each function here accepts
both: a call that binds to the destination-first signature with tiles in its tile
parameters is the new form, anything else the legacy form.
"""

from __future__ import annotations

import enum

# The instructions live in one module per engine group; this module is the namespace.
from .isa_elementwise import (
    activation,
    activation_into,
    activation_reduce,
    activation_reduce_into,
    reciprocal,
    reciprocal_into,
    scalar_tensor_tensor,
    scalar_tensor_tensor_into,
    tensor_copy,
    tensor_copy_into,
    tensor_reduce,
    tensor_reduce_into,
    tensor_scalar,
    tensor_scalar_into,
    tensor_tensor,
    tensor_tensor_into,
)
from .isa_statistics_gpsimd_dma import (
    affine_select,
    affine_select_into,
    bn_aggr,
    bn_aggr_into,
    bn_stats,
    bn_stats_into,
    dma_copy,
    iota,
    iota_into,
    memset,
    memset_into,
    tensor_partition_reduce,
)
from .isa_tensor_engine import nc_matmul, nc_matmul_into, nc_transpose, nc_transpose_into

__all__ = [
    "activation",
    "activation_into",
    "activation_reduce",
    "activation_reduce_into",
    "affine_select",
    "affine_select_into",
    "bn_aggr",
    "bn_aggr_into",
    "bn_stats",
    "bn_stats_into",
    "dge_mode",
    "dma_copy",
    "engine",
    "get_nc_version",
    "iota",
    "iota_into",
    "memset",
    "memset_into",
    "nc_matmul",
    "nc_matmul_into",
    "nc_transpose",
    "nc_transpose_into",
    "nc_version",
    "oob_mode",
    "reciprocal",
    "reciprocal_into",
    "reduce_cmd",
    "scalar_tensor_tensor",
    "scalar_tensor_tensor_into",
    "tensor_copy",
    "tensor_copy_into",
    "tensor_partition_reduce",
    "tensor_reduce",
    "tensor_reduce_into",
    "tensor_scalar",
    "tensor_scalar_into",
    "tensor_tensor",
    "tensor_tensor_into",
]


class engine(enum.Enum):  # noqa: N801  (NKI's names)
    unknown = 0
    tensor = 1
    vector = 2
    scalar = 3
    gpsimd = 4
    sync = 5


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


class oob_mode(enum.Enum):  # noqa: N801
    error = 0
    skip = 1


class nc_version(enum.Enum):  # noqa: N801
    gen2 = 2
    gen3 = 3
    gen4 = 4


def get_nc_version() -> nc_version:
    from .profile import target_name

    return {"trn1": nc_version.gen2, "trn2": nc_version.gen3, "trn3": nc_version.gen4}[
        target_name()
    ]
