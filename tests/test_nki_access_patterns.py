"""``tensor.ap()``: NKI's hardware access patterns (AWS, "NKI Access Patterns"), checked
against numpy's indexing of the same elements, with the rules the hardware enforces and a
start offset read from the device (``scalar_offset``)."""

from __future__ import annotations

import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki import NkiError

RNG = np.random.default_rng(3)


def test_a_pattern_reads_what_the_equivalent_slice_reads() -> None:
    """The documentation's example: t[0:16, 8:16] of a (16, 16) tile is pattern
    [[16, 16], [1, 8]] from offset 8; and an HBM pattern that takes every other column of
    rows 2..5, written through a pattern on the output."""

    @nki.jit
    def kernel(x):
        out = nl.ndarray((16, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        strided = nl.ndarray((4, 8), dtype=nl.float32, buffer=nl.shared_hbm)
        tile = nl.load(x)
        nl.store(out, value=nl.copy(tile.ap([[16, 16], [1, 8]], offset=8)))
        picked = nl.ndarray((4, 8), dtype=nl.float32)
        nisa.dma_copy(dst=picked, src=x.ap([[16, 4], [2, 8]], offset=2 * 16))
        nisa.dma_copy(dst=strided.ap([[8, 4], [1, 8]], offset=0), src=picked)
        return out, strided

    x = RNG.standard_normal((16, 16), dtype=np.float32)
    for run in (kernel.interpret, kernel, kernel):  # interpreter, trace, the second call
        out, strided = run(x)
        np.testing.assert_array_equal(out, x[:, 8:16])
        np.testing.assert_array_equal(strided, x[2:6, 0::2])


def test_scalar_offset_from_the_device_moves_the_start() -> None:
    """A row index read from HBM into a register picks the row block the kernel copies; the
    second call, with another index, takes another block (the launch is traced per call)."""

    @nki.jit
    def rows_at(x, index):
        out = nl.ndarray((4, 32), dtype=nl.float32, buffer=nl.shared_hbm)
        row = nisa.register_alloc()
        nisa.register_load(row, index)
        block = nl.ndarray((4, 32), dtype=nl.float32)
        nisa.dma_copy(dst=block, src=x.ap([[32, 4], [1, 32]], offset=0, scalar_offset=row))
        nl.store(out, value=block)
        return out

    x = RNG.standard_normal((64, 32), dtype=np.float32)
    for start in (0, 7, 60, 13):
        index = np.array([[start]], np.int32)
        np.testing.assert_array_equal(rows_at(x, index), x[start : start + 4])
    with pytest.raises(IndexError, match="reaches outside the tensor's 2048 elements"):
        rows_at(x, np.array([[61]], np.int32))


def test_rules_of_access_patterns() -> None:
    def run(body):  # noqa: ANN001, ANN202
        return nki.jit(body).interpret(np.zeros((128, 64), np.float32))

    def every_other_partition(x):  # noqa: ANN001
        nl.load(x).ap([[128, 64], [1, 64]])

    with pytest.raises(NkiError, match="must step by the tile's free size 64"):
        run(every_other_partition)

    def too_many_partitions(x):  # noqa: ANN001
        x.ap([[64, 129], [1, 64]], offset=0)

    with pytest.raises(IndexError, match="reaches outside"):
        run(too_many_partitions)

    def malformed(x):  # noqa: ANN001
        nl.load(x).ap([[64, 128], [1]])

    with pytest.raises(NkiError, match=r"pattern must be \[\[step, num\], ...\]"):
        run(malformed)
