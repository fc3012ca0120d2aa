"""``torch.distributed`` on neuron: the process-group backend ``neuron`` (process_group.py)."""

from __future__ import annotations

from .process_group import register, transport

__all__ = ["register", "transport"]
