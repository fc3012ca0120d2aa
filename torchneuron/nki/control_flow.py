"""Device scalars and the control flow they steer (NKI 0.6-0.8): virtual registers
(``nisa.register_alloc/move/load/store``), scalars read from a tile (``nisa.scalar_load``),
and the compiled loops and conditional (``nl.fori_loop``, ``nl.while_loop``, ``nl.if_else``).

On Trainium these run on the engines' sequencers with values known only at run time. The
interpreter knows every value as the kernel runs, so a loop calls its body once per iteration
and a conditional calls the branch its value selects. Python control flow on a device value
(``if reg:``, ``range(reg)``, ``int(reg)``) is refused, as NKI's tracer refuses it. A launch
that read a device value is data-dependent: the program it recorded holds one control path,
so the compiled path does not keep it and traces the kernel again on every call (launch.py).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from . import dtypes, interpreter
from .errors import NkiError
from .tiles import Tile

_INT32 = 2**32


def _wrap32(value: int) -> int:
    """A 32-bit register's value (two's complement), as the sequencers compute."""
    value = int(value) % _INT32
    return value - _INT32 if value >= 2**31 else value


def _value(x: Any, what: str) -> int:
    if isinstance(x, NkiScalar):
        return x.value
    if isinstance(x, (bool, int, np.integer)):
        return int(x)
    raise NkiError(f"{what} takes an int or a device scalar (register), not {type(x).__name__}")


class NkiScalar:
    """A 32-bit value on the device: arithmetic and comparisons give device scalars."""

    __slots__ = ("value",)

    def __init__(self, value: int = 0) -> None:
        self.value = _wrap32(value)

    def _binary(self, other: Any, op: Callable[[int, int], Any], swap: bool = False) -> NkiScalar:
        a, b = self.value, _value(other, "a device scalar's arithmetic")
        return NkiScalar(int(op(b, a) if swap else op(a, b)))

    def __add__(self, o: Any) -> NkiScalar:
        return self._binary(o, operator.add)

    def __radd__(self, o: Any) -> NkiScalar:
        return self._binary(o, operator.add, True)

    def __sub__(self, o: Any) -> NkiScalar:
        return self._binary(o, operator.sub)

    def __rsub__(self, o: Any) -> NkiScalar:
        return self._binary(o, operator.sub, True)

    def __mul__(self, o: Any) -> NkiScalar:
        return self._binary(o, operator.mul)

    def __rmul__(self, o: Any) -> NkiScalar:
        return self._binary(o, operator.mul, True)

    def __lt__(self, o: Any) -> NkiScalar:
        return self._binary(o, operator.lt)

    def __le__(self, o: Any) -> NkiScalar:
        return self._binary(o, operator.le)

    def __gt__(self, o: Any) -> NkiScalar:
        return self._binary(o, operator.gt)

    def __ge__(self, o: Any) -> NkiScalar:
        return self._binary(o, operator.ge)

    def __eq__(self, o: Any) -> NkiScalar:  # type: ignore[override]
        return self._binary(o, operator.eq)

    def __ne__(self, o: Any) -> NkiScalar:  # type: ignore[override]
        return self._binary(o, operator.ne)

    __hash__ = None  # type: ignore[assignment]

    def _refuse(self, *_: Any) -> Any:
        raise TypeError(
            "a device scalar's value is not known while the kernel is traced: Python control "
            "flow and int()/range() cannot use it; use nl.fori_loop, nl.while_loop or nl.if_else"
        )

    __bool__ = __int__ = __index__ = __float__ = _refuse  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"  # the value is the device's, not the trace's


class VirtualRegister(NkiScalar):
    """An engine sequencer's register (``nisa.register_alloc``)."""

    __slots__ = ()


def register_alloc(x: Any = None) -> VirtualRegister:
    return VirtualRegister(0 if x is None else _value(x, "nisa.register_alloc"))


def _register(dst: Any, what: str) -> VirtualRegister:
    if not isinstance(dst, VirtualRegister):
        raise NkiError(f"{what}: dst must be a register from nisa.register_alloc()")
    return dst


def register_move(dst: Any, src: Any) -> None:
    _register(dst, "nisa.register_move").value = _wrap32(_value(src, "nisa.register_move"))


def _one_element(src: Any, what: str) -> int:
    if not isinstance(src, Tile):
        raise NkiError(f"{what}: src must be a tensor in HBM or SBUF, not {type(src).__name__}")
    if src.buffer.name == "psum":
        raise NkiError(f"{what}: src must be in HBM or SBUF, not PSUM")
    if int(np.prod(src.shape, dtype=np.int64)) != 1:
        raise NkiError(
            f"{what}: src must hold exactly one element ([1] or [1, 1]), not {src.shape}"
        )
    if dtypes.itemsize(src.dtype) > 4:
        raise NkiError(f"{what}: a register holds 32 bits; {dtypes.name(src.dtype)} is wider")
    launch = interpreter.current()
    launch.data_dependent = True
    value = np.asarray(interpreter.read(src, False)).reshape(())
    if np.issubdtype(value.dtype, np.floating):  # the register takes the value's 32 bits
        return int(value.astype(np.float32).view(np.int32))
    return int(value)


def scalar_value_of(x: Any, what: str) -> int:
    """The value of a run-time scalar operand: an int, a device scalar or register, or a 1x1
    tensor read from the device (which makes the launch data-dependent)."""
    if isinstance(x, Tile):
        return _one_element(x, what)
    return _value(x, what)


def register_load(dst: Any, src: Any) -> None:
    _register(dst, "nisa.register_load").value = _wrap32(_one_element(src, "nisa.register_load"))


def register_store(dst: Any, src: Any) -> None:
    if not isinstance(dst, Tile) or int(np.prod(dst.shape, dtype=np.int64)) != 1:
        raise NkiError("nisa.register_store: dst must be a one-element tensor in HBM or SBUF")
    if dst.buffer.name == "psum":
        raise NkiError("nisa.register_store: dst must be in HBM or SBUF, not PSUM")
    value = _value(_register(src, "nisa.register_store"), "nisa.register_store")
    interpreter.write(dst, np.full(dst.shape, value), None, "set")


def scalar_load(src: Any) -> NkiScalar:
    return NkiScalar(_one_element(src, "nisa.scalar_load"))


def _register_loop(what: str) -> None:
    if interpreter.current().no_reorder_depth:
        raise NkiError(
            f"{what}: register-based dynamic loops are not supported inside nl.no_reorder() "
            "(static loops are: affine_range, sequential_range, static_range)"
        )


def fori_loop(lower: Any, upper: Any, body_fun: Callable[[Any], None], step: int = 1) -> None:
    """Calls ``body_fun(i)`` for i from `lower` to `upper` (exclusive) by `step`; i is a
    register holding the iteration's value (writing it does not change the loop)."""
    for i in dynamic_range(lower, upper, step, what="nl.fori_loop"):
        body_fun(i)


def dynamic_range(start: Any, stop: Any = None, step: int = 1, *, what: str = "") -> Any:
    """The iterations of a loop whose bounds may be registers, on the device: registers
    holding start, start + step, ... below stop."""
    what = what or "nl.dynamic_range"
    _register_loop(what)
    if stop is None:
        start, stop = 0, start
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step <= 0:
        raise NkiError(f"{what}: step must be a positive Python int, not {step!r}")
    first, last = _value(start, what), _value(stop, what)
    for i in range(first, last, int(step)):
        yield VirtualRegister(i)


class no_reorder:  # noqa: N801  (NKI's name)
    """``with nl.no_reorder():`` keeps the block's instructions in program order. The
    interpreter runs every instruction in program order already; the block refuses the
    register-based loops NKI refuses inside it."""

    def __enter__(self) -> no_reorder:
        interpreter.current().no_reorder_depth += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        interpreter.current().no_reorder_depth -= 1


def while_loop(init: Any, body_fun: Callable[[Any], Any]) -> None:
    """Calls ``r = body_fun(r)`` while the condition register r is nonzero (checked before
    each iteration: a zero `init` runs no iteration)."""
    _register_loop("nl.while_loop")
    condition = _value(init, "nl.while_loop")
    while condition != 0:
        following = body_fun(VirtualRegister(condition))
        if not isinstance(following, NkiScalar):
            raise NkiError(
                "nl.while_loop: the body must return the next condition register, got "
                f"{type(following).__name__}"
            )
        condition = following.value


def if_else(
    cond: Any, then_fn: Callable[[], None], else_fn: Callable[[], None] | None = None
) -> None:
    """Calls `then_fn` when `cond` is nonzero, else `else_fn` (if given)."""
    if _value(cond, "nl.if_else") != 0:
        then_fn()
    elif else_fn is not None:
        else_fn()
