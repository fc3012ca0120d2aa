"""torch.nn.attention.varlen in compiled graphs.

``varlen_attn`` is a custom op (``torch_attn::_varlen_attn``, with ``_varlen_attn_backward``)
whose implementation calls ``aten._flash_attention_forward``/``_backward`` on its inputs'
device. Graphs compiled by the neuron backend run on host aliases of neuron memory, where
that would be the CPU's, which has no such kernel. :func:`use_host_varlen_attention` points
the nodes at ``torchneuron::varlen_attn``/``varlen_attn_backward`` (same schemas; C++,
csrc/aten/attention/varlen_attention.cpp), whose CPU kernels run neuron's own implementation,
so compiled and eager calls compute the same. Not a native-kernel choice: it applies with
``TORCHNEURON_NATIVE_KERNELS=0`` too.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from .. import _C  # noqa: F401 - defines the torchneuron:: ops

_RETARGETS = {
    "torch_attn::_varlen_attn": "varlen_attn",
    "torch_attn::_varlen_attn_backward": "varlen_attn_backward",
}


@torch.library.register_fake("torchneuron::varlen_attn")
def _varlen_attn_fake(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
    return torch.ops.torch_attn._varlen_attn(*args, **kwargs)  # its own fake implementation


@torch.library.register_fake("torchneuron::varlen_attn_backward")
def _varlen_attn_backward_fake(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
    return torch.ops.torch_attn._varlen_attn_backward(*args, **kwargs)


def use_host_varlen_attention(gm: torch.fx.GraphModule) -> int:
    """Points the graph's varlen attention nodes at torchneuron's ops; returns how many."""
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
