"""How one ``nisa`` function serves both NKI API generations (see isa.py)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from . import interpreter, ops
from .tiles import Tile

_TILE_PARAMS = ("dst", "data", "data1", "data2", "src", "stationary", "moving")


def _generations(new: Callable[..., Any], legacy: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(new)

    def instruction(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return legacy(*args, **kwargs)
        named = bound.arguments
        if all(isinstance(named[p], Tile) for p in _TILE_PARAMS if p in named):
            return new(*args, **kwargs)
        return legacy(*args, **kwargs)

    instruction.__name__ = instruction.__qualname__ = new.__name__.removesuffix("_into")
    instruction.__doc__ = new.__doc__
    instruction.__wrapped__ = new  # type: ignore[attr-defined]
    return instruction


def _tensor_like(value: Any, what: str) -> Any:
    value = interpreter.operand(value)
    ops.compute(value, what)
    return value
