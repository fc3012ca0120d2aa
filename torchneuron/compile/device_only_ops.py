"""Ops that neuron has and the CPU lacks, in compiled graphs.

Graphs compiled by the neuron backend run on host aliases of neuron memory, so every op in them
runs its CPU kernel. Some ops neuron implements have none on the CPU:
``aten._scaled_dot_product_efficient_attention`` and ``_scaled_dot_product_flash_attention``
(what SDPA takes under ``sdpa_kernel(EFFICIENT_ATTENTION)``, and what Diffusers' ``_native_flash``
backend calls), with their backward, and ``torch.nn.attention.varlen``'s custom ops
(``torch_attn::_varlen_attn`` and its backward), whose implementation calls
``aten._flash_attention_forward`` on its inputs' device. :func:`use_device_only_ops` points
their nodes at torchneuron ops of the same schemas (C++, csrc/aten/attention/fused_attention.cpp
and varlen_attention.cpp) whose CPU kernels run neuron's own implementations, so compiled and
eager calls compute the same. Not a native-kernel choice: it applies with
``TORCHNEURON_NATIVE_KERNELS=0`` too.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from .. import _C  # noqa: F401 - defines the torchneuron:: ops

# The op a node names (its schema) -> the torchneuron op of the same schema.
_RETARGETS = {
    "aten::_scaled_dot_product_efficient_attention": "efficient_attention",
    "aten::_scaled_dot_product_efficient_attention_backward": "efficient_attention_backward",
    "aten::_scaled_dot_product_flash_attention": "flash_attention",
    "aten::_scaled_dot_product_flash_attention_backward": "flash_attention_backward",
    "torch_attn::_varlen_attn": "varlen_attn",
    "torch_attn::_varlen_attn_backward": "varlen_attn_backward",
}


# The fake kernels are the original ops' own: the torchneuron kernels lay their results out
# as torch's meta functions describe them.
@torch.library.register_fake("torchneuron::efficient_attention")
def _efficient_attention_fake(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
    return torch.ops.aten._scaled_dot_product_efficient_attention(*args, **kwargs)


@torch.library.register_fake("torchneuron::efficient_attention_backward")
def _efficient_attention_backward_fake(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
    return torch.ops.aten._scaled_dot_product_efficient_attention_backward(*args, **kwargs)


@torch.library.register_fake("torchneuron::flash_attention")
def _flash_attention_fake(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
    return torch.ops.aten._scaled_dot_product_flash_attention(*args, **kwargs)


@torch.library.register_fake("torchneuron::flash_attention_backward")
def _flash_attention_backward_fake(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
    return torch.ops.aten._scaled_dot_product_flash_attention_backward(*args, **kwargs)


# torch_attn's ops exist once torch.nn.attention.varlen is imported, which a graph holding
# them has done.
@torch.library.register_fake("torchneuron::varlen_attn")
def _varlen_attn_fake(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
    return torch.ops.torch_attn._varlen_attn(*args, **kwargs)


@torch.library.register_fake("torchneuron::varlen_attn_backward")
def _varlen_attn_backward_fake(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
    return torch.ops.torch_attn._varlen_attn_backward(*args, **kwargs)


def use_device_only_ops(gm: torch.fx.GraphModule) -> int:
    """Points the graph's nodes of ops the CPU lacks at torchneuron's; returns how many."""
    count = 0
    for node in gm.graph.nodes:
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        name = _RETARGETS.get(schema.name) if schema is not None else None
        if name is not None:
            node.target = getattr(torch.ops.torchneuron, name).default
            count += 1
    if count:
        gm.recompile()
    return count
