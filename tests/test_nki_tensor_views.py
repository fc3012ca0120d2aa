"""NKI 0.8's ``NkiTensor`` view methods (tensor_views.py) against numpy's views of the same
data: each kernel copies through the view, in the interpreter and the compiled path (twice:
the recording and its replay), and the rules that keep an on-chip partition dimension whole
are enforced with the reason."""

from __future__ import annotations

import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki import NkiError

RNG = np.random.default_rng(5)


def _runs(kernel):
    return (kernel.interpret, kernel, kernel)


def test_slice_select_expand_squeeze_reshape_on_hbm_and_on_chip() -> None:
    @nki.jit
    def kernel(x):  # x: (4, 128, 24)
        sliced = nl.ndarray((128, 8), dtype=x.dtype, buffer=nl.shared_hbm)
        split = nl.ndarray((128, 4, 6), dtype=x.dtype, buffer=nl.shared_hbm)
        merged = nl.ndarray((128, 24), dtype=x.dtype, buffer=nl.shared_hbm)
        block = x.select(0, 2)  # (128, 24), HBM: the dimension goes
        tile = nl.ndarray((128, 24), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=block)
        nisa.dma_copy(dst=sliced, src=tile.slice(1, 4, 20, 2))
        grid = tile.reshape_dim(1, (4, -1))  # (128, 4, 6) on chip
        nisa.dma_copy(dst=split, src=grid)
        wide = grid.expand_dim(2).squeeze_dim(2).flatten_dims(1, 2)  # back to (128, 24)
        nisa.dma_copy(dst=merged, src=wide)
        return sliced, split, merged

    x = RNG.standard_normal((4, 128, 24), dtype=np.float32)
    for run in _runs(kernel):
        sliced, split, merged = run(x)
        np.testing.assert_array_equal(sliced, x[2][:, 4:20:2])
        np.testing.assert_array_equal(split, x[2].reshape(128, 4, 6))
        np.testing.assert_array_equal(merged, x[2])


def test_permute_broadcast_and_rearrange() -> None:
    @nki.jit
    def kernel(x, row):  # x: (128, 24), row: (128, 1, 6)
        turned = nl.ndarray((128, 6, 4), dtype=x.dtype, buffer=nl.shared_hbm)
        spread = nl.ndarray((128, 3, 6), dtype=x.dtype, buffer=nl.shared_hbm)
        tile = nl.ndarray((128, 24), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=x)
        # split dim 1 into (h, w) with h = 4, then order (b, w, h)
        view = tile.rearrange(("b", ("h", "w")), ("b", "w", "h"), {"h": 4})
        copied = nl.ndarray((128, 6, 4), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=copied, src=view)
        nisa.dma_copy(dst=turned, src=copied)
        small = nl.ndarray((128, 1, 6), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=small, src=row)
        wide = nl.ndarray((128, 3, 6), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_copy(dst=wide, src=small.broadcast(1, 3))
        nisa.dma_copy(dst=spread, src=wide)
        return turned, spread

    x = RNG.standard_normal((128, 24), dtype=np.float32)
    row = RNG.standard_normal((128, 1, 6), dtype=np.float32)
    for run in _runs(kernel):
        turned, spread = run(x, row)
        np.testing.assert_array_equal(turned, x.reshape(128, 4, 6).transpose(0, 2, 1))
        np.testing.assert_array_equal(spread, np.broadcast_to(row, (128, 3, 6)))


def test_dynamic_select_reads_its_index_on_the_device() -> None:
    @nki.jit
    def kernel(x, index):  # x: (8, 128, 16); index: (1, 1)
        out = nl.ndarray((128, 16), dtype=x.dtype, buffer=nl.shared_hbm)
        idx = nl.ndarray((1, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx, src=index)
        nisa.dma_copy(dst=out, src=x.select(0, idx))
        return out

    x = RNG.standard_normal((8, 128, 16), dtype=np.float32)
    for which in (3, 0, 7):  # the launch is traced per call: each index takes effect
        np.testing.assert_array_equal(kernel(x, np.array([[which]], np.int32)), x[which])
    with pytest.raises(IndexError, match="index 8 outside dimension 0 of size 8"):
        kernel(x, np.array([[8]], np.int32))


def test_get_pattern_and_is_contiguous() -> None:
    seen = {}

    @nki.jit
    def kernel(x):
        tile = nl.ndarray((128, 4, 6), dtype=x.dtype, buffer=nl.sbuf)
        seen["tile"] = (tile.get_pattern(), tile.is_contiguous())
        seen["sliced"] = tile.slice(2, 0, 6, 2).is_contiguous()
        seen["permuted"] = tile.permute((0, 2, 1)).is_contiguous()
        seen["hbm"] = (x.get_pattern(), x.slice(0, 0, 2, 1).is_contiguous())
        return x

    kernel.interpret(np.zeros((4, 8), np.float32))
    assert seen["tile"] == ([[24, 128], [6, 4], [1, 6]], True)
    assert (seen["sliced"], seen["permuted"]) == (False, False)
    assert seen["hbm"] == ([[8, 4], [1, 8]], True)


@pytest.mark.parametrize(
    ("view", "message"),
    [
        (lambda t: t.permute((1, 0, 2)), "partition dimension first"),
        (lambda t: t.squeeze_dim(0), "partition dimension"),
        (lambda t: t.broadcast(1, 3), "only 1 broadcasts"),
        (lambda t: t.reshape((64, 48)), "keeps its 128 partitions"),
        (lambda t: t.flatten_dims(0, 1), "partition dimension"),
        (lambda t: t.slice(1, 3, 3), "need 0 <= start < end"),
        (lambda t: t.permute((0, 2, 1)).reshape((128, 24)), "without copying"),
        (lambda t: t.rearrange(("b", ("h", "w")), ("b", "h", "w")), "source groups"),
    ],
)
def test_views_that_would_break_the_layout_are_refused(view, message: str) -> None:
    @nki.jit
    def kernel(x):
        tile = nl.ndarray((128, 4, 6), dtype=x.dtype, buffer=nl.sbuf)
        view(tile)
        return x

    with pytest.raises(NkiError, match=message):
        kernel.interpret(np.zeros((2, 2), np.float32))
