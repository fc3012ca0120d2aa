"""The ``neuron`` backend for ``torch.compile``.

Dynamo finds it through the ``torch_dynamo_backends`` entry point, so
``torch.compile(model, backend="neuron")`` works without importing anything, and
Transformers' automatic compilation of static-cache generation on a neuron device (which
asks for this backend by name) runs.

Today the backend executes the graph Dynamo captured with the device's eager kernels: it
gives whole-graph capture, the per-signature guards and recompiles of ``torch.compile``,
and exactly the eager numerics. Lowering the graph to generated code is tracked separately
(the compile issue); this module is where it goes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def neuron_backend(
    graph_module: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any
) -> Callable[..., Any]:
    """Dynamo backend: runs the captured FX graph on the neuron device's kernels."""
    return graph_module.forward
