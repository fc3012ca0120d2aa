"""The native decode attention (csrc/kernels/sdpa_decode.h) in compiled graphs.

Graphs compiled by the neuron backend are Inductor CPU code run over host aliases of neuron
memory, so their attention calls the CPU's flash kernel
(``aten._scaled_dot_product_flash_attention_for_cpu``), which Inductor runs as an extern
kernel. :func:`use_native_decode_attention` retargets the nodes whose queries have at most
8 rows (a decode step against a static KV cache: the path Transformers compiles on neuron)
to ``torchneuron::native_sdpa_decode`` (C++, csrc/aten/native/native_attention_decode.cpp), which
runs the native kernel where it applies and the CPU kernel otherwise. The eager neuron op
takes the same kernel. :func:`use_widened_attention_backward` retargets bf16 backward nodes
to ``torchneuron::sdpa_backward_widened``
(csrc/aten/attention/attention_backward_widened.cpp), which on hosts without native bf16
computes large ones in float32, as the eager neuron op does.
``TORCHNEURON_NATIVE_KERNELS=0`` leaves graphs alone.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch
import torch.fx

from .. import _C  # noqa: F401 - defines the torchneuron:: ops
from .native_gemm import native_kernels_enabled

_NATIVE_DTYPES = (torch.float32, torch.bfloat16)
_MAX_QUERY_ROWS = 8  # as kMaxNativeQueryRows in native_attention_decode.cpp


@torch.library.register_fake("torchneuron::native_sdpa_decode")
def _native_sdpa_decode_fake(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    # The CPU flash kernel's own meta: the same shapes, dtypes and strides.
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale
    )


def _logsumexp_used(node: torch.fx.Node) -> bool:
    return any(
        user.op == "call_function" and user.target is operator.getitem and user.args[1] == 1
        for user in node.users
    )


def _retarget(
    gm: torch.fx.GraphModule,
    source: object,
    target: object,
    query_at: int,
    accept: Callable[[torch.fx.Node, torch.Tensor], bool],
) -> int:
    """Points the graph's ``source`` nodes whose query (argument ``query_at``, by its fake
    value) ``accept`` takes at ``target``; returns how many."""
    if not native_kernels_enabled():
        return 0
    replaced = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not source:
            continue
        arg = node.args[query_at]
        query = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
        if isinstance(query, torch.Tensor) and accept(node, query):
            node.target = target
            replaced += 1
    if replaced:
        gm.recompile()
    return replaced


def _decode_sized(node: torch.fx.Node, query: torch.Tensor) -> bool:
    if query.dtype not in _NATIVE_DTYPES or query.dim() != 4:
        return False
    rows = query.shape[2]
    if not isinstance(rows, int) or rows > _MAX_QUERY_ROWS:
        return False
    # As the eager op decides: several float32 rows whose logsumexp feeds a backward keep
    # the CPU kernel (a backward from the native forward missed the CPU's by 7e-5 once).
    return not (query.dtype == torch.float32 and rows > 1 and _logsumexp_used(node))


def use_native_decode_attention(gm: torch.fx.GraphModule) -> int:
    """Points the graph's decode-sized CPU flash attention nodes at the native kernel; returns
    how many."""
    return _retarget(
        gm,
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
        torch.ops.torchneuron.native_sdpa_decode.default,
        0,
        _decode_sized,
    )


@torch.library.register_fake("torchneuron::sdpa_backward_widened")
def _sdpa_backward_widened_fake(
    grad_out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    logsumexp: torch.Tensor,
    dropout_p: float,
    is_causal: bool,
    *,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # The CPU backward's own meta: the same shapes, dtypes and strides.
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        grad_out,
        query,
        key,
        value,
        out,
        logsumexp,
        dropout_p,
        is_causal,
        attn_mask=attn_mask,
        scale=scale,
    )


def use_widened_attention_backward(gm: torch.fx.GraphModule) -> int:
    """Points the graph's bf16 CPU flash-attention backward nodes at
    ``torchneuron::sdpa_backward_widened`` (which keeps the CPU kernel where widening does not
    pay); returns how many."""
    return _retarget(
        gm,
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
        torch.ops.torchneuron.sdpa_backward_widened.default,
        1,
        lambda _node, query: query.dtype == torch.bfloat16,
    )
