"""The native GEMM (csrc/kernels) in compiled graphs.

Graphs compiled by the neuron backend are Inductor CPU code run over host aliases of neuron
memory, so their matmuls would call the CPU's ``aten.mm``. :func:`use_native_gemm` retargets
an ATen graph's float32/bfloat16 ``aten.mm``/``addmm``/``bmm`` nodes that the native GEMM is
preferred for (:func:`native_gemm_preferred`), and the bfloat16 ``mm``/``addmm`` it is not (which
the C++ op hands to oneDNN with the output rows split over the task board, so an idle stream
worker computes half), to the custom ops
``torchneuron::native_mm``/``native_addmm``/``native_bmm`` (C++, csrc/aten/native/native_gemm.cpp),
which Inductor calls as extern kernels. ``TORCHNEURON_NATIVE_KERNELS=0`` leaves graphs alone.
"""

from __future__ import annotations

import torch
import torch.fx

from .. import _C  # also defines the torchneuron:: ops

_NATIVE_DTYPES = (torch.float32, torch.bfloat16)


def native_kernels_enabled() -> bool:
    """False when TORCHNEURON_NATIVE_KERNELS=0 (the C++ switch, read once per process)."""
    return bool(_C._native_kernels_enabled())


def native_gemm_preferred(dtype: torch.dtype, rows: int, columns: int) -> bool:
    """Whether a ``rows`` × ``columns`` product in ``dtype`` runs the native GEMM here (else
    PyTorch's CPU kernel, oneDNN: see gemm_preferred in csrc/kernels/gemm.h)."""
    return bool(torch.ops.torchneuron.native_gemm_preferred(dtype, rows, columns))


def native_gemm_calls() -> int:
    """How many products the native GEMM has computed in this process."""
    return int(torch.ops.torchneuron.native_gemm_calls())


@torch.library.register_fake("torchneuron::native_mm")
def _native_mm_fake(self: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    return self.new_empty((self.shape[0], mat2.shape[1]))


@torch.library.register_fake("torchneuron::native_bmm")
def _native_bmm_fake(self: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    return self.new_empty((self.shape[0], self.shape[1], mat2.shape[2]))


@torch.library.register_fake("torchneuron::native_addmm")
def _native_addmm_fake(
    self: torch.Tensor,
    mat1: torch.Tensor,
    mat2: torch.Tensor,
    *,
    beta: float = 1,
    alpha: float = 1,
) -> torch.Tensor:
    return mat1.new_empty((mat1.shape[0], mat2.shape[1]))


def _replacements() -> dict[object, object]:
    aten, native = torch.ops.aten, torch.ops.torchneuron
    return {
        aten.mm.default: native.native_mm.default,
        aten.bmm.default: native.native_bmm.default,
        aten.addmm.default: native.native_addmm.default,
    }


def use_native_gemm(gm: torch.fx.GraphModule) -> int:
    """Points the graph's float32/bf16 mm/addmm/bmm nodes at the native ops; returns how many."""
    if not native_kernels_enabled():
        return 0
    replacements = _replacements()
    replaced = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in replacements:
            continue
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor) or value.dtype not in _NATIVE_DTYPES:
            continue
        shared = value.dtype == torch.bfloat16 and node.target is not torch.ops.aten.bmm.default
        preferred = native_gemm_preferred(value.dtype, int(value.shape[-2]), int(value.shape[-1]))
        if not (preferred or shared):
            continue
        node.target = replacements[node.target]
        replaced += 1
    if replaced:
        gm.recompile()
    return replaced
