"""Compatibility module: code written for AWS's ``torch_neuronx`` imports this name.

The neuron device itself comes from ``torchneuron`` (autoloaded by ``import torch``);
importing ``torch_neuronx`` makes sure it is registered even with
``TORCH_DEVICE_BACKEND_AUTOLOAD=0``.
"""

from __future__ import annotations

from importlib.metadata import version as _version

import torchneuron as _torchneuron  # noqa: F401  (registers the neuron device)

__version__ = _version("torch-neuronx")
