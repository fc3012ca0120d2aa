"""NKI (the Neuron Kernel Interface) on the ``neuron`` device.

Kernels written for Trainium run here by changing their import lines::

    import torchneuron.nki as nki                # for neuronxcc.nki / nki
    import torchneuron.nki.language as nl        # for neuronxcc.nki.language / nki.language
    import torchneuron.nki.isa as nisa           # for neuronxcc.nki.isa / nki.isa

or unchanged after ``torchneuron.nki.install_aliases()`` (which maps ``neuronxcc.nki`` and
``nki`` to this package when they are not installed). See docs/nki.md.
"""

from __future__ import annotations

from . import compiler, isa, language, typing  # noqa: F401
from .aliases import install_aliases  # noqa: F401
from .benchmarking import benchmark, profile  # noqa: F401
from .chip_profile import current_profile  # noqa: F401
from .cost import CostEstimate  # noqa: F401
from .errors import NkiCapacityError, NkiError, NkiUnsupportedError  # noqa: F401
from .launch import Kernel, baremetal, estimate, jit, simulate, simulate_kernel  # noqa: F401
from .tiles import Tile  # noqa: F401

tensor = Tile  # annotation name kernels use (nki.tensor)
# The legacy ``neuronxcc.nki.trace`` decorator AWS's API examples use with simulate_kernel.
trace = jit

__all__ = [
    "CostEstimate",
    "Kernel",
    "NkiCapacityError",
    "NkiError",
    "NkiUnsupportedError",
    "Tile",
    "baremetal",
    "benchmark",
    "compiler",
    "current_profile",
    "estimate",
    "install_aliases",
    "isa",
    "jit",
    "language",
    "profile",
    "simulate",
    "simulate_kernel",
    "trace",
]
