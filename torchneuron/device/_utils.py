"""Helpers torch.serialization looks up on the device module."""

from __future__ import annotations

from ._device import _get_device_index

__all__ = ["_get_device_index"]
