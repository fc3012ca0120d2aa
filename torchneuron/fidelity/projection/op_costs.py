"""FLOPs and HBM bytes of every op of a traced step (fake tensors: nothing runs)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry


@dataclass
class OpCost:
    name: str
    calls: int = 0
    flops: int = 0
    bytes: int = 0  # inputs read + outputs written, no fusion assumed
    low_precision_flops: int = 0  # of flops, those in bf16/fp16


@dataclass
class StepCosts:
    ops: dict[str, OpCost] = field(default_factory=dict)

    @property
    def flops(self) -> int:
        return sum(o.flops for o in self.ops.values())

    @property
    def bytes(self) -> int:
        return sum(o.bytes for o in self.ops.values())


def _tensor_bytes(values: Any) -> int:
    return sum(
        t.numel() * t.element_size() for t in tree_leaves(values) if isinstance(t, torch.Tensor)
    )


class OpCostMode(TorchDispatchMode):
    """Counts each op's FLOPs (PyTorch's flop formulas) and bytes moved."""

    def __init__(self) -> None:
        super().__init__()
        self.costs = StepCosts()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.is_view or not any(isinstance(t, torch.Tensor) for t in tree_leaves(out)):
            return out  # views and metadata queries (prim.device) move no bytes
        name = str(func.overloadpacket)
        cost = self.costs.ops.setdefault(name, OpCost(name))
        cost.calls += 1
        formula = flop_registry.get(func.overloadpacket)
        if formula is not None:
            flops = int(formula(*args, **kwargs, out_val=out))
            cost.flops += flops
            first = next((t for t in tree_leaves(args) if isinstance(t, torch.Tensor)), None)
            if first is not None and first.dtype in (torch.bfloat16, torch.float16):
                cost.low_precision_flops += flops
        cost.bytes += _tensor_bytes(args) + _tensor_bytes(kwargs) + _tensor_bytes(out)
        return out
