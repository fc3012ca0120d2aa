"""The registry of ``nisa`` instructions: each is defined once, in both NKI API generations.

The newer ``nki.isa`` takes the destination first (``nisa.nc_matmul(dst, stationary,
moving)``); the legacy ``neuronxcc.nki.isa`` returns a new tile (``nisa.nc_matmul(stationary,
moving)`` returns a PSUM tile). An instruction module defines the destination-first form
under ``@instruction(engine=...)`` and, where the legacy form differs, registers it with
``@<name>.legacy``; the resulting :class:`Instruction` accepts both. ``isa.py`` builds the
``nisa`` namespace from :data:`INSTRUCTIONS`, so adding an instruction is one definition.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from . import interpreter, ops
from .tiles import Tile

# Parameters that hold tiles in destination-first signatures: a call binding tiles to all of
# them is the new form.
_TILE_PARAMS = (
    "dst",
    "data",
    "data1",
    "data2",
    "src",
    "stationary",
    "moving",
    "src_buffer",
    "index",
)


class Instruction:
    """One ``nisa`` instruction: its name, engine, and its forms in both API generations.

    Calling it picks the form: a call that binds to the destination-first signature with
    tiles in its tile parameters is the new form, anything else the legacy form.
    """

    def __init__(self, name: str, engine: str, into: Callable[..., Any]) -> None:
        self.name = name
        self.engine = engine  # the engine that runs it (and whose time the estimate charges)
        self.into = into  # the destination-first form
        self.returns_tile: Callable[..., Any] | None = None  # the legacy form, when it differs
        self.signature = inspect.signature(into)
        self.__name__ = self.__qualname__ = name
        self.__doc__ = into.__doc__
        self.__wrapped__ = into

    def legacy(self, returns_tile: Callable[..., Tile]) -> Callable[..., Tile]:
        """Registers the legacy form (it returns a new tile); used as a decorator."""
        self.returns_tile = returns_tile
        return returns_tile

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.returns_tile is None:
            return self.into(*args, **kwargs)
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError:
            return self._legacy(args, kwargs)
        named = bound.arguments
        if all(isinstance(named[p], Tile) for p in _TILE_PARAMS if p in named):
            return self.into(*args, **kwargs)
        return self._legacy(args, kwargs)

    def _legacy(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The tile-returning form; its result remembers the call's mask=, so that
        ``t[k] = nisa.f(..., mask=m)`` leaves t unchanged where m is false. A mask over the
        inputs that does not fit the result (bn_stats' window) was the instruction's own."""
        assert self.returns_tile is not None
        result = self.returns_tile(*args, **kwargs)
        mask = kwargs.get("mask")
        if isinstance(result, Tile) and mask is not None and ops.mask_fits(mask, result.shape):
            result.write_mask = mask
        return result

    def __repr__(self) -> str:
        return f"<nisa.{self.name} ({self.engine})>"


# Every instruction by name, in definition order.
INSTRUCTIONS: dict[str, Instruction] = {}


def instruction(engine: str) -> Callable[[Callable[..., Any]], Instruction]:
    """Registers the decorated function as the ``nisa`` instruction of the same name: its
    destination-first form (or its only form, when both generations share it)."""

    def register(into: Callable[..., Any]) -> Instruction:
        if into.__name__ in INSTRUCTIONS:
            raise ValueError(f"nisa.{into.__name__} is defined twice")
        defined = Instruction(into.__name__, engine, into)
        INSTRUCTIONS[defined.name] = defined
        return defined

    return register


def on_chip_operand(value: Any, what: str) -> Any:
    """An instruction's tile operand: SBUF or PSUM data a compute engine can read."""
    value = interpreter.operand(value)
    ops.compute(value, what)
    return value
