"""Opt-in import aliases: ``neuronxcc.nki`` and ``nki`` resolving to ``torchneuron.nki``.

Only names that are not importable already are installed, so a real Neuron SDK install is
never shadowed. Nothing is installed unless the user calls :func:`install_aliases`.
"""

from __future__ import annotations

import importlib.util
import sys
import types

from . import compiler, isa, language, typing


def _importable(name: str) -> bool:
    if name in sys.modules:
        return True
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def install_aliases(legacy: bool = True, new: bool = True) -> list[str]:
    """Maps ``neuronxcc.nki[.language|.isa|.typing]`` (legacy) and ``nki[...]`` (new) to
    this package where those packages are not installed. Returns the names installed."""
    package = sys.modules[__package__]  # torchneuron.nki, imported before it imports this module
    installed: list[str] = []
    roots = []
    if legacy:
        roots.append("neuronxcc.nki")
    if new:
        roots.append("nki")
    for root in roots:
        top = root.split(".")[0]
        if _importable(top):
            continue
        if root != top:
            parent = types.ModuleType(top)
            parent.__path__ = []  # a namespace for the alias only
            sys.modules[top] = parent
            setattr(parent, root.split(".")[1], package)
            installed.append(top)
        sys.modules[root] = package
        modules = (("language", language), ("isa", isa), ("typing", typing), ("compiler", compiler))
        for name, module in modules:
            sys.modules[f"{root}.{name}"] = module
        # ``from neuronxcc.nki.isa.constants import dge_mode`` (AWS's API examples)
        constants = types.ModuleType(f"{root}.isa.constants")
        for name in ("dge_mode", "oob_mode", "reduce_cmd", "engine", "nc_version"):
            setattr(constants, name, getattr(isa, name))
        sys.modules[constants.__name__] = constants
        installed.append(root)
    return installed
