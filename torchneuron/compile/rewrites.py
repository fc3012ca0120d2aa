"""Graph rewrites of the neuron compile backend: patterns onto our native kernels.

Hugging Face's SiLU-gated MLP computes ``act_fn(gate_proj(x)) * up_proj(x)``: two
elementwise ops with no single aten op. Dynamo captures it as ``F.silu(a)`` feeding
``operator.mul``; this pass replaces the pair by ``torch.ops.torchneuron.silu_mul(a, b)``
(csrc/aten/native/native_gated_mlp_ops.cpp), before AOT Autograd, so forward and backward graphs
both call our kernel (its autograd formula is registered here). Inductor then calls it as an
extern kernel. Why only where both operands have one shape and a float32/bfloat16 dtype:
that is what the kernel takes; broadcasting gates stay Inductor's. Why it costs no fusion:
in the MLP both operands come from matmuls and the product goes to one, all extern calls,
so Inductor's kernel for the pair stands alone anyway.

Opt-in (``TORCHNEURON_COMPILE_REWRITES=1``): measured against Inductor's own C++ for the
pair (benchmarks/RESULTS.md, issue 15), ours did not win clearly on this host (within the
noise of a loaded 2-core host for 512 x 1408, slower for 64 x 2048 where the extern call's
cost shows), and the brief is to route compiled graphs to a native kernel only where it
beats Inductor. ``TORCHNEURON_NATIVE_KERNELS=0`` turns the pass off in any case.
"""

from __future__ import annotations

import operator
import os
import threading
from typing import Any

import torch
import torch.nn.functional as F

_lock = threading.Lock()
_counters: dict[str, int] = {"silu_mul": 0}
_autograd_registered = False

_SILU_TARGETS = (F.silu, torch.nn.functional.silu)
_MUL_TARGETS = (operator.mul, torch.mul, torch.Tensor.mul)
_DTYPES = (torch.float32, torch.bfloat16)


def rewrites_enabled() -> bool:
    """Whether TORCHNEURON_COMPILE_REWRITES asks for the rewrites (read at each compile)."""
    value = os.environ.get("TORCHNEURON_COMPILE_REWRITES", "0")
    if value not in ("0", "1"):
        raise ValueError(
            f"TORCHNEURON_COMPILE_REWRITES={value!r} is not valid: use 1 (rewrite silu(a) * b "
            "to the native kernel in neuron-compiled graphs) or 0 (Inductor's code, the default)"
        )
    return value == "1"


def rewrite_counters(reset: bool = False) -> dict[str, int]:
    """How many patterns each rewrite replaced since load (or the last reset)."""
    with _lock:
        result = dict(_counters)
        if reset:
            for key in _counters:
                _counters[key] = 0
    return result


def _silu_mul_setup(ctx: Any, inputs: tuple[torch.Tensor, torch.Tensor], output: Any) -> None:
    ctx.save_for_backward(*inputs)


def _silu_mul_backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    gate, up = ctx.saved_tensors
    return torch.ops.torchneuron.silu_mul_backward(grad.contiguous(), gate, up)


def _register_autograd() -> None:
    global _autograd_registered
    with _lock:
        if _autograd_registered:
            return
        torch.library.register_autograd(
            "torchneuron::silu_mul", _silu_mul_backward, setup_context=_silu_mul_setup
        )
        _autograd_registered = True


def _example(node: Any) -> torch.Tensor | None:
    value = node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _is_silu(node: Any) -> bool:
    return (
        isinstance(node, torch.fx.Node)
        and node.op == "call_function"
        and node.target in _SILU_TARGETS
        and len(node.args) == 1
        and not node.kwargs.get("inplace", False)
    )


def rewrite_silu_mul(gm: torch.fx.GraphModule) -> int:
    """Replaces ``silu(a) * b`` (silu's result used only there) by ``silu_mul(a, b)``."""
    from torchneuron import _C

    if not rewrites_enabled() or not _C._native_kernels_enabled():
        return 0
    replaced = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _MUL_TARGETS or node.kwargs:
            continue
        if len(node.args) != 2:
            continue
        first, second = node.args
        silu, other = (first, second) if _is_silu(first) else (second, first)
        if not _is_silu(silu) or len(silu.users) != 1:
            continue
        gate = silu.args[0]
        gate_value, up_value = _example(gate), _example(other)
        if gate_value is None or up_value is None:
            continue
        if (
            gate_value.dtype not in _DTYPES
            or up_value.dtype != gate_value.dtype
            or gate_value.shape != up_value.shape
            or gate_value.device != up_value.device
        ):
            continue
        with gm.graph.inserting_before(node):
            fused = gm.graph.call_function(torch.ops.torchneuron.silu_mul.default, (gate, other))
        fused.meta.update(node.meta)
        node.replace_all_uses_with(fused)
        gm.graph.erase_node(node)
        gm.graph.erase_node(silu)
        replaced += 1
    if replaced:
        _register_autograd()
        gm.graph.lint()
        gm.recompile()
        with _lock:
            _counters["silu_mul"] += replaced
    return replaced
