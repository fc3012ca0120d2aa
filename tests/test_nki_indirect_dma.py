"""Per-partition indirect DMA (``tensor.ap(pattern, vector_offset=idx, indirect_dim=0)``,
``tensor.vector_select(0, idx)``): gathers and scatters checked against numpy's fancy indexing
of the same rows, scatter-add against ``np.add.at``, out-of-bounds rows raising or skipped as
``oob_mode`` says, in the interpreter and the compiled path (traced on each call, so new
index values take effect)."""

from __future__ import annotations

import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki import NkiError

RNG = np.random.default_rng(11)


@nki.jit
def gather_rows(data, indices):
    """Partition p gets columns 8..40 of row indices[p] (a column window, as MoE token
    gathers take one shard of the hidden size)."""
    rows, width = indices.shape[0], 32
    out = nl.ndarray((rows, width), dtype=data.dtype, buffer=nl.shared_hbm)
    idx = nl.ndarray((rows, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx, src=indices)
    picked = nl.ndarray((rows, width), dtype=data.dtype, buffer=nl.sbuf)
    nisa.memset(dst=picked, value=-1.0)
    source = data.ap(pattern=[[data.shape[1], rows], [1, width]], offset=8, vector_offset=idx)
    nisa.dma_copy(dst=picked, src=source, oob_mode=nisa.oob_mode.skip)
    nisa.dma_copy(dst=out, src=picked)
    return out


def _runs(kernel):
    return (kernel.interpret, kernel, kernel)  # interpreter, first compiled call, second


def test_gather_reads_the_rows_each_partition_names() -> None:
    data = RNG.standard_normal((300, 48), dtype=np.float32)
    for run in _runs(gather_rows):
        indices = RNG.integers(0, 300, size=(128, 1)).astype(np.int32)  # repeats allowed
        np.testing.assert_array_equal(run(data, indices), data[indices[:, 0], 8:40])


def test_skipped_partitions_keep_what_the_tile_held() -> None:
    data = RNG.standard_normal((300, 48), dtype=np.float32)
    indices = RNG.integers(0, 300, size=(128, 1)).astype(np.int32)
    indices[[3, 77]] = [[300], [-2]]  # past the end, before the start
    expected = data[np.clip(indices[:, 0], 0, 299), 8:40]
    expected[[3, 77]] = -1.0
    for run in _runs(gather_rows):
        np.testing.assert_array_equal(run(data, indices), expected)


def test_an_out_of_bounds_row_raises_by_default_naming_the_partition() -> None:
    @nki.jit
    def gather_strict(data, indices):
        out = nl.ndarray((64, 16), dtype=data.dtype, buffer=nl.shared_hbm)
        idx = nl.ndarray((64, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx, src=indices)
        tile = nl.ndarray((64, 16), dtype=data.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=data.ap([[16, 64], [1, 16]], vector_offset=idx))
        nisa.dma_copy(dst=out, src=tile)
        return out

    data = RNG.standard_normal((100, 16), dtype=np.float32)
    indices = np.arange(64, dtype=np.int32).reshape(64, 1)
    np.testing.assert_array_equal(gather_strict(data, indices), data[:64])
    indices[5] = 100
    with pytest.raises(IndexError, match="partition 5's row index 100 reaches outside"):
        gather_strict(data, indices)


@nki.jit
def scatter_rows(cache, rows, indices, add):
    """Writes (or, with add, adds) rows[p] into row indices[p] of cache, in place."""
    count, width = rows.shape
    tile = nl.ndarray((count, width), dtype=rows.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=tile, src=rows)
    idx = nl.ndarray((count, 1), dtype=nl.int32, buffer=nl.sbuf)
    nisa.dma_copy(dst=idx, src=indices)
    target = cache.ap(pattern=[[width, count], [1, width]], offset=0, vector_offset=idx)
    if add:
        nisa.dma_copy(dst=target, src=tile, dst_rmw_op=nl.add, oob_mode=nisa.oob_mode.skip)
    else:
        nisa.dma_copy(dst=target, src=tile, oob_mode=nisa.oob_mode.skip)
    return cache


def test_scatter_writes_rows_in_place_and_leaves_the_others() -> None:
    for run in _runs(scatter_rows):
        cache = RNG.standard_normal((512, 64), dtype=np.float32)
        rows = RNG.standard_normal((128, 64), dtype=np.float32)
        indices = RNG.permutation(512)[:128].reshape(128, 1).astype(np.int32)
        indices[9] = 512  # skipped: nothing written
        expected = cache.copy()
        keep = indices[:, 0] < 512
        expected[indices[keep, 0]] = rows[keep]
        result = run(cache, rows, indices, False)
        np.testing.assert_array_equal(result, expected)
        np.testing.assert_array_equal(cache, expected)  # the caller's array, written back


def test_scatter_add_adds_every_repeated_row() -> None:
    for run in _runs(scatter_rows):
        cache = RNG.standard_normal((40, 16), dtype=np.float32)
        rows = RNG.standard_normal((128, 16), dtype=np.float32)
        indices = RNG.integers(0, 40, size=(128, 1)).astype(np.int32)  # ~3 per row
        expected = cache.astype(np.float64)
        np.add.at(expected, indices[:, 0], rows)
        np.testing.assert_allclose(run(cache, rows, indices, True), expected, rtol=1e-5, atol=1e-5)


def test_vector_select_and_an_index_column_taken_by_a_pattern() -> None:
    """``t.vector_select(0, idx)`` on a (64, 4, 8) tensor gives (128, 4, 8); the index is
    column 2 of an on-chip (128, 3) index tile, taken with ``.ap`` (as DSA-style kernels do)."""

    @nki.jit
    def select(data, index_matrix):
        out = nl.ndarray((128, 4, 8), dtype=data.dtype, buffer=nl.shared_hbm)
        matrix = nl.ndarray((128, 3), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=matrix, src=index_matrix)
        column = matrix.ap(pattern=[[3, 128], [1, 1]], offset=2)
        tile = nl.load(data.vector_select(0, column))
        nl.store(out, value=tile)
        return out

    data = RNG.standard_normal((64, 4, 8), dtype=np.float32)
    for run in _runs(select):
        index_matrix = RNG.integers(0, 64, size=(128, 3)).astype(np.int32)
        np.testing.assert_array_equal(run(data, index_matrix), data[index_matrix[:, 2]])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda x, i: x.ap([[16, 64], [1, 16]], vector_offset=i, indirect_dim=1), "indirect_dim=0"),
        (lambda x, i: x.ap([[16, 64], [1, 16]], vector_offset=i[0:32]), r"\(64, 1\)"),
        (lambda x, i: x.ap([[16, 64], [1, 16]], vector_offset=i, scalar_offset=0), "exclusive"),
        (lambda x, i: nl.load(x).ap([[16, 64], [1, 16]], vector_offset=i), "must be in HBM"),
    ],
)
def test_malformed_indirect_views_are_refused(make, message: str) -> None:
    @nki.jit
    def kernel(x, indices):
        idx = nl.ndarray((64, 1), dtype=nl.int32, buffer=nl.sbuf)
        nisa.dma_copy(dst=idx, src=indices)
        tile = nl.ndarray((64, 16), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=make(x, idx))
        return x

    x = RNG.standard_normal((64, 16), dtype=np.float32)
    with pytest.raises(NkiError, match=message):
        kernel(x, np.zeros((64, 1), np.int32))


# -- the legacy form: t[index_tile, ...] (found missing by AWS's API examples) --------------
@nki.jit
def legacy_gather(data, indices, skip):
    rows = indices.shape[0]
    out = nl.ndarray((rows, data.shape[1]), dtype=data.dtype, buffer=nl.shared_hbm)
    i_p = nl.arange(rows)[:, None]
    i_f = nl.arange(data.shape[1])[None, :]
    idx = nl.load(indices[i_p, nl.arange(1)[None, :]])
    tile = nisa.memset(shape=(rows, data.shape[1]), value=-1.0, dtype=data.dtype)
    mode = nisa.oob_mode.skip if skip else nisa.oob_mode.error
    nisa.dma_copy(src=data[idx, i_f], dst=tile[i_p, i_f], oob_mode=mode)
    nl.store(out, value=tile)
    return out


def test_legacy_indirect_gather_with_each_oob_mode() -> None:
    data = RNG.standard_normal((128, 64), dtype=np.float32)
    for run in _runs(legacy_gather):  # the compiled path replays with each call's indices
        indices = RNG.integers(0, 128, size=(32, 1)).astype(np.int32)
        np.testing.assert_array_equal(run(data, indices, False), data[indices[:, 0]])
    indices[[4, 9]] = [[130], [-1]]
    expected = data[np.clip(indices[:, 0], 0, 127)]
    expected[[4, 9]] = -1.0
    np.testing.assert_array_equal(legacy_gather(data, indices, True), expected)
    # as AWS's simulator words it: the first element outside, as a flat index
    with pytest.raises(IndexError, match="^index 8320 is out of bounds for axis 0 with size 8192$"):
        legacy_gather(data, indices, False)


@nki.jit
def legacy_scatter(rows, indices, add):
    n, m = rows.shape
    out = nl.ndarray((128, m), dtype=rows.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nisa.memset(shape=(128, m), value=1.0, dtype=rows.dtype))
    i_p = nl.arange(n)[:, None]
    i_f = nl.arange(m)[None, :]
    idx = nl.load(indices[i_p, nl.arange(1)[None, :]])
    tile = nl.load(rows)
    if add:
        nisa.dma_copy(dst=out[idx, i_f], src=tile, dst_rmw_op=np.add)
    else:
        nl.store(out[idx[i_p, 0], i_f], value=tile)
    return out


def test_legacy_indirect_scatter_and_scatter_add() -> None:
    for run in _runs(legacy_scatter):
        rows = RNG.standard_normal((48, 16), dtype=np.float32)
        distinct = RNG.permutation(128)[:48].reshape(48, 1).astype(np.int32)
        expected = np.ones((128, 16), np.float32)
        expected[distinct[:, 0]] = rows
        np.testing.assert_array_equal(run(rows, distinct, False), expected)
        repeated = RNG.integers(0, 20, size=(48, 1)).astype(np.int32)
        expected = np.ones((128, 16), np.float64)
        np.add.at(expected, repeated[:, 0], rows)
        np.testing.assert_allclose(run(rows, repeated, True), expected, rtol=1e-6, atol=1e-6)
