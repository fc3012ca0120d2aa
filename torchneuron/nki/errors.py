"""Errors raised by the NKI simulator.

The hardware's rules (tile sizes, buffers, capacities, dtypes) are checked when a kernel is
traced, as the Neuron compiler checks them; a violation is an :class:`NkiError` whose text
names the rule, the values seen and the limit. ``NkiError`` is a ``ValueError`` so code that
catches PyTorch's argument errors also catches it.
"""

from __future__ import annotations


class NkiError(ValueError):
    """A kernel broke a rule of the NeuronCore (or of the NKI language)."""


class NkiCapacityError(NkiError, MemoryError):
    """On-chip memory (SBUF or PSUM) of the target chip is exhausted."""


class NkiUnsupportedError(NkiError, NotImplementedError):
    """A valid NKI feature this simulator does not implement."""
