"""The device's random numbers: ``nl.random_seed``, ``nl.rand`` and ``nl.dropout``.

Trainium's generator is not specified bit for bit, so this one is numpy's PCG64: the same
seed gives the same numbers within a launch here (what NKI documents: "Using the same seed
will generate the same sequence of random numbers"), not the hardware's numbers. A launch
starts from seed 0; a launch that draws numbers is traced again on every call, so each call
draws afresh from its seed instead of replaying the numbers of the first.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import interpreter, ops
from .control_flow import scalar_value_of
from .errors import NkiError
from .tiles import Tile


def generator() -> np.random.Generator:
    """The launch's generator (seed 0 until nl.random_seed)."""
    launch = interpreter.current()
    if launch.random is None:
        launch.random = np.random.default_rng(0)
    return launch.random


def random_seed(seed: Any, **_: Any) -> None:
    """Seeds the generator from a (1, 1) tile (or register) holding a 32-bit value."""
    if isinstance(seed, Tile) and not seed.buffer.on_chip:
        raise NkiError("nl.random_seed: the seed is a [1, 1] tensor in SBUF or PSUM")
    value = scalar_value_of(seed, "nl.random_seed")
    interpreter.current().random = np.random.default_rng(value & 0xFFFFFFFF)


def rand(
    shape: Any, dtype: Any = np.float32, *, buffer: Any = None, name: str = "", **_: Any
) -> Tile:
    """A new tile of uniform random values in [0, 1) (float32 unless `dtype`, as the legacy
    ``nl.rand(shape)``)."""
    from .language import ndarray

    tile = ndarray(shape, dtype, buffer=buffer) if buffer is not None else ndarray(shape, dtype)
    draws = generator()
    interpreter.execute(
        lambda: draws.random(tile.shape, dtype=np.float32),
        [],
        [(tile, None, "set")],
        "gpsimd",
        ops.free_size(tile.shape),
    )
    return tile


def dropout(x: Any, rate: Any, *, dtype: Any = None, mask: Any = None, **_: Any) -> Tile:
    """`x` with each element zeroed with probability `rate` (a scalar, or a (partitions, 1)
    tile of per-partition rates); kept elements are unchanged (no rescaling)."""
    x = interpreter.operand(x)
    ops.compute(x, "nl.dropout")
    out = ops.new_tile(x.shape, ops.result_dtype(dtype, [x]))
    drop_into(out, x, rate, mask, "nl.dropout", "gpsimd")
    return out


def drop_into(dst: Tile, x: Tile, rate: Any, mask: Any, what: str, engine: str) -> None:
    """dst = x with each element zeroed with probability `rate` (nl.dropout, nisa.dropout)."""
    rate = interpreter.operand(rate)
    if isinstance(rate, Tile):
        ops.compute(rate, f"{what} (rate)")
        if rate.shape[0] != x.shape[0] or ops.free_size(rate.shape) != 1:
            raise NkiError(
                f"{what}: a rate tile is ({x.shape[0]}, 1), one rate per partition; got "
                f"{rate.shape}"
            )
    elif not 0.0 <= float(rate) <= 1.0:
        raise NkiError(f"{what}: rate {rate} is not a probability in [0, 1]")
    draws = generator()
    rank = len(x.shape)

    def body(v: Any, p: Any) -> Any:
        p = ops.pad(np.asarray(p, np.float32), rank) if np.ndim(p) else np.float32(p)
        keep = draws.random(np.shape(v), dtype=np.float32) >= p
        return np.where(keep, ops.f32(v), np.float32(0))

    interpreter.execute(body, [x, rate], [(dst, mask, "set")], engine, ops.free_size(x.shape))
