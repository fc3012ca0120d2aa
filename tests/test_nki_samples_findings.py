"""What running AWS's public NKI samples unchanged (python -m torchneuron.nki.samples on a
checkout of aws-neuron/nki-samples) found missing or refused, each as a kernel of our own
checked against numpy in the interpreter and the compiled path; and the samples command
itself on a checkout laid out as AWS's."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.compiler as ncc
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki import NkiCapacityError, NkiError, NkiUnsupportedError

RNG = np.random.default_rng(11)


def _both(kernel, *args):
    """The kernel through the interpreter, and through the compiled path (second call)."""
    interpreted = kernel.interpret(*args)
    kernel(*args)
    return interpreted, kernel(*args)


def test_bfloat16_numpy_arrays_in_and_out() -> None:
    assert np.dtype(nl.bfloat16) == np.dtype(ml_dtypes.bfloat16)
    x = nl.static_cast(RNG.standard_normal((128, 64)), nl.bfloat16)
    assert x.dtype == ml_dtypes.bfloat16

    @nki.jit
    def double(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.add(nl.load(a), nl.load(a)))
        return out

    for got in _both(double, x):
        assert got.dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(got.astype(np.float32), 2 * x.astype(np.float32))


def test_partition_vector_written_to_a_column() -> None:
    """A (128,) reduction written to a (128, 1) slice, as AWS's small-head attention does."""

    @nki.jit
    def column_max(a):
        out = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.sbuf)
        for j in nl.affine_range(4):
            block = nl.load(a[:, j * 32 : (j + 1) * 32])
            acc[nl.arange(128)[:, None], j] = nisa.tensor_reduce(np.max, data=block, axis=(1,))
        nl.store(out, value=acc)
        return out

    a = RNG.standard_normal((128, 128), dtype=np.float32)
    for got in _both(column_max, a):
        np.testing.assert_array_equal(got, a.reshape(128, 4, 32).max(-1))

    @nki.jit
    def row_sums(a):  # and the other way: a (128, 1) value into a (128,) tile
        out = nl.ndarray((128,), dtype=nl.float32, buffer=nl.shared_hbm)
        sums = nl.ndarray((128,), dtype=nl.float32, buffer=nl.sbuf)
        sums[...] = nisa.tensor_reduce(np.add, data=nl.load(a), axis=(1,), keepdims=True)
        nl.store(out, value=sums)
        return out

    for got in _both(row_sums, a):
        np.testing.assert_allclose(got, a.sum(1), rtol=1e-5, atol=1e-5)

    @nki.jit
    def spread(a):  # a [P] tile broadcast along the free dimension (sd_attention tutorial)
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        col = nisa.tensor_reduce(np.max, data=nl.load(a), axis=(1,))
        nl.store(out, value=col.broadcast_to((128, 64)))
        return out

    for got in _both(spread, a):
        np.testing.assert_array_equal(got, np.repeat(a.max(1, keepdims=True), 64, axis=1))


def test_reduction_masked_over_its_input_and_slices_past_the_end() -> None:
    """Adaptive pooling's pattern: the last tile of 200 rows reaches past the end under a
    mask, and a sum masked over the window's free axes."""

    @nki.jit
    def masked_row_sums(a, valid):
        out = nl.ndarray((a.shape[0], 1), dtype=nl.float32, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(64)[None, :]
        for t in nl.affine_range(2):
            rows = t * 128 + i_p
            tile = nl.zeros((128, 64), dtype=nl.float32)
            nisa.dma_copy(src=a[t * 128 : (t + 1) * 128, 0:64], dst=tile, mask=rows < a.shape[0])
            total = nl.sum(tile, axis=[1], keepdims=True, mask=i_f < valid)
            nl.store(out[t * 128 : (t + 1) * 128, 0:1], value=total, mask=rows < a.shape[0])
        return out

    a = RNG.standard_normal((200, 64), dtype=np.float32)
    for got in _both(masked_row_sums, a, 40):
        np.testing.assert_allclose(got[:, 0], a[:, :40].sum(1), rtol=1e-6, atol=1e-5)

    @nki.jit
    def unmasked(a):
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        nl.store(out, value=nl.load(a[128:256, 0:64]))
        return out

    with pytest.raises(IndexError, match="guard the access with mask="):
        unmasked.interpret(a)


def test_bn_stats_masked_over_its_input_window() -> None:
    """The legacy layernorm tutorial's pattern: bn_stats per 512-column chunk, the last chunk
    reaching past the end under a mask over the input's columns; bn_aggr gives the mean and
    variance of exactly the valid columns. Also the dst form, and a mask that differs by
    partition (each row's statistics over its own window)."""
    fmax = nl.tile_size.bn_stats_fmax

    @nki.jit
    def row_moments(a):
        rows, cols = a.shape
        out = nl.ndarray((rows, 2), dtype=nl.float32, buffer=nl.shared_hbm)
        chunks = (cols + fmax - 1) // fmax
        i_p = nl.arange(rows)[:, None]
        i_f = nl.arange(fmax)[None, :]
        i_s = nl.arange(6)[None, :]
        tile = nl.load(a)
        stats = nl.ndarray((rows, 6 * chunks), dtype=nl.float32)
        for j in nl.affine_range(chunks):
            stats[i_p, j * 6 + i_s] = nisa.bn_stats(
                tile[i_p, j * fmax + i_f], mask=(j * fmax + i_f < cols), dtype=nl.float32
            )
        nl.store(out, value=nisa.bn_aggr(stats))
        return out

    for cols in (1000, 70):
        a = RNG.standard_normal((128, cols), dtype=np.float32) + 3
        for got in _both(row_moments, a):
            np.testing.assert_allclose(got[:, 0], a.mean(1), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(got[:, 1], a.var(1), rtol=1e-4, atol=1e-5)

    @nki.jit
    def staggered(a):
        out = nl.ndarray((128, 6), dtype=nl.float32, buffer=nl.shared_hbm)
        stats = nl.zeros((128, 6), dtype=nl.float32)
        i_p = nl.arange(128)[:, None]
        i_f = nl.arange(a.shape[1])[None, :]
        nisa.bn_stats(dst=stats, data=nl.load(a), mask=2 * i_f < i_p + 2)  # row r: (r+1)//2 + 1
        nl.store(out, value=stats)
        return out

    a = RNG.standard_normal((128, 64), dtype=np.float32)
    for got in _both(staggered, a):
        for r in range(128):
            window = a[r, : (r + 1) // 2 + 1]
            for half, part in enumerate((window[0::2], window[1::2])):
                assert got[r, 3 * half] == part.size
                if part.size:
                    np.testing.assert_allclose(got[r, 3 * half + 1], part.mean(), atol=1e-5)
                    np.testing.assert_allclose(got[r, 3 * half + 2], part.var(), atol=1e-5)

    @nki.jit
    def misfit(a):
        stats = nl.ndarray((128, 6), dtype=nl.float32)
        nisa.bn_stats(dst=stats, data=nl.load(a), mask=nl.arange(3)[None, :] < 2)
        return stats

    with pytest.raises(NkiError, match=r"fits neither the input \(128, 64\) nor dst"):
        misfit.interpret(a)


def test_legacy_matmul_takes_a_psum_operand_and_transpose_mode() -> None:
    @nki.jit
    def transposed_product(x, y):
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        x_t = nisa.nc_transpose(nl.load(x))  # a PSUM tile, used as the stationary operand
        nl.store(out, value=nl.copy(nisa.nc_matmul(x_t, nl.load(y))))
        return out

    x = RNG.standard_normal((128, 128), dtype=np.float32)
    y = RNG.standard_normal((128, 128), dtype=np.float32)
    for got in _both(transposed_product, x, y):
        np.testing.assert_allclose(got, x @ y, rtol=1e-5, atol=1e-4)

    @nki.jit
    def transpose_mode(x):
        out = nl.ndarray((64, 128), dtype=x.dtype, buffer=nl.shared_hbm)
        identity = nl.load(nl.shared_constant(np.identity(128, dtype=np.int8), dtype=x.dtype))
        result = nisa.nc_matmul(nl.load(x), identity, is_transpose=True)
        assert result.dtype == nl.float16  # the input's dtype from NeuronCore-v3 (trn2) on
        nl.store(out, value=nl.copy(result))
        return out

    x16 = RNG.standard_normal((128, 64)).astype(np.float16)
    for got in _both(transpose_mode, x16):
        np.testing.assert_array_equal(got, x16.T)


def test_tensor_scalar_reduce_mod_finfo_and_spmd_dim() -> None:
    @nki.jit
    def scaled_with_sum(a):
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        sums = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        total = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        y = nisa.tensor_scalar_reduce(
            data=nl.load(a), op0=nl.multiply, operand0=3.0, reduce_op=nl.add, reduce_res=total
        )
        nl.store(out, value=y)
        nl.store(sums, value=total)
        return out, sums

    a = RNG.standard_normal((128, 96), dtype=np.float32)
    for got, sums in _both(scaled_with_sum, a):
        np.testing.assert_allclose(got, 3 * a, rtol=1e-6)
        np.testing.assert_allclose(sums[:, 0], (3 * a).sum(1), rtol=1e-5, atol=1e-4)

    @nki.jit
    def remainder(a):
        out = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.shared_hbm)
        nl.store(out, value=nl.mod(nl.load(a), 7, dtype=nl.int32))
        return out

    ints = RNG.integers(0, 1000, (128, 32)).astype(np.int32)
    for got in _both(remainder, ints):
        np.testing.assert_array_equal(got, ints % 7)

    assert nl.fp32.min == np.finfo(np.float32).min
    assert nl.finfo(nl.bfloat16).max == ml_dtypes.finfo(ml_dtypes.bfloat16).max
    assert (
        nisa.get_nc_version() >= nisa.nc_version.gen2 and nisa.vector_engine is nisa.engine.vector
    )

    @nki.jit
    def add(a, b):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        i = nl.program_id(0) * 128 + nl.arange(128)[:, None]
        j = nl.arange(64)[None, :]
        nl.store(out[i, j], value=nl.load(a[i, j]) + nl.load(b[i, j]))
        return out

    x = RNG.standard_normal((512, 64), dtype=np.float32)
    np.testing.assert_array_equal(add[nl.spmd_dim(2, nl.nc(2))](x, x), 2 * x)


def test_tensor_tensor_scan_is_the_linear_recurrence() -> None:
    """Mamba's scan: h[i] = a[i] * h[i-1] + b[i] from a per-partition initial value."""

    @nki.jit
    def scan(a, b, h0):
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        h = nisa.tensor_tensor_scan(
            nl.load(a), nl.load(b), initial=nl.load(h0), op0=nl.multiply, op1=nl.add
        )
        nl.store(out, value=h)
        return out

    a = RNG.uniform(0.5, 1.0, (128, 64)).astype(np.float32)
    b = RNG.standard_normal((128, 64), dtype=np.float32)
    h0 = RNG.standard_normal((128, 1), dtype=np.float32)
    expected = np.empty((128, 64))
    h = h0[:, 0].astype(np.float64)
    for i in range(64):
        h = a[:, i] * h + b[:, i]
        expected[:, i] = h
    for got in _both(scan, a, b, h0):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)

    @nki.jit
    def scan_from_zero(a, b):
        out = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        h = nisa.tensor_tensor_scan(nl.load(a), nl.load(b), 0, np.multiply, np.add)
        nl.store(out, value=h)
        return out

    # in float32 step by step, as the engine (an integer initial value once made the whole
    # scan float64, and AWS's Mamba tutorial's versions disagreed)
    expected32 = np.empty((128, 64), np.float32)
    h32 = np.zeros(128, np.float32)
    for i in range(64):
        h32 = a[:, i] * h32 + b[:, i]
        expected32[:, i] = h32
    for got in _both(scan_from_zero, a, b):
        np.testing.assert_array_equal(got, expected32)

    @nki.jit
    def many_scans(a):  # the Mamba tutorial's pattern: a scan per iteration, tiles dying
        out = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 1), dtype=nl.float32)
        for _ in nl.sequential_range(12):
            big = nl.load(a)  # 64 KiB per partition; 12 of them exceed SBUF if kept alive
            h = nisa.tensor_tensor_scan(big, big, 0.0, np.multiply, np.add)
            acc[...] = nl.add(acc, h[:, 16383:16384])
        nl.store(out, value=acc)
        return out

    ones = np.full((128, 16384), 0.5, np.float32)
    # the recorded program kept each scan's tiles alive; h = 0.5 h + 0.5 from 0 reaches 1.0
    # in float32 long before 16384 steps, so each iteration adds exactly 1
    for got in _both(many_scans, ones):
        np.testing.assert_array_equal(got, np.full((128, 1), 12.0, np.float32))


def test_indirect_load_gathers_rows_named_by_a_tile() -> None:
    """resize_nearest's gather: row indices computed on the device (a tile), read under a
    mask; rows the mask drops may hold any index."""

    @nki.jit
    def gather_rows(table, rows):
        out = nl.ndarray((128, table.shape[1]), dtype=table.dtype, buffer=nl.shared_hbm)
        i_p = nl.arange(128)[:, None]
        idx = nl.load(rows)
        picked = nl.load(table[idx, nl.arange(table.shape[1])[None, :]], mask=i_p < 100)
        nl.store(out, value=picked, mask=i_p < 100)
        return out

    table = RNG.standard_normal((300, 48), dtype=np.float32)
    rows = RNG.integers(0, 300, (128, 1)).astype(np.int32)
    rows[100:] = 10_000  # out of range, but masked off
    for got in _both(gather_rows, table, rows):
        np.testing.assert_array_equal(got[:100], table[rows[:100, 0]])


def test_loop_reduce_accumulates_into_the_assigned_tile() -> None:
    """Flash-attention backward's dq: acc[...] = nl.loop_reduce(x, op, loop_indices)."""

    @nki.jit
    def sum_and_max_of_blocks(a):
        out = nl.ndarray((128, 2 * 64), dtype=nl.float32, buffer=nl.shared_hbm)
        total = nl.zeros((128, 64), dtype=nl.float32)
        peak = nl.full((128, 64), -np.inf, dtype=nl.float32)
        for i in nl.affine_range(4):
            block = nl.load(a[:, i * 64 : (i + 1) * 64])
            total[...] = nl.loop_reduce(block, op=np.add, loop_indices=(i,))
            peak[...] = nl.loop_reduce(block, op=np.maximum, loop_indices=(i,))
        nl.store(out[:, 0:64], value=total)
        nl.store(out[:, 64:128], value=peak)
        return out

    a = RNG.standard_normal((128, 256), dtype=np.float32)
    blocks = a.reshape(128, 4, 64)
    for got in _both(sum_and_max_of_blocks, a):
        np.testing.assert_allclose(got[:, :64], blocks.sum(1), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got[:, 64:], blocks.max(1))


def test_masked_result_assigned_into_a_tile_writes_only_where_the_mask_holds() -> None:
    """``t[...] = nisa.affine_select(..., mask=m)`` as flash attention's sliding window uses
    it: the instruction writes into t, so t keeps its values where m is false (a fresh
    result tile's zeros overwrote them)."""

    @nki.jit
    def masked_updates(a, apply):
        out = nl.ndarray((128, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        t = nl.load(a)
        i_p, i_f = nl.mgrid[0:128, 0:64]
        t[...] = nisa.affine_select(pred=i_f <= i_p, on_true_tile=t, on_false_value=-9.0)
        t[...] = nisa.tensor_scalar(t, np.multiply, 2.0, mask=apply)  # a Python bool
        t[...] = nl.add(t, 100.0, mask=(i_p < 64))  # half the partitions
        nl.store(out, value=t)
        return out

    a = RNG.standard_normal((128, 64), dtype=np.float32)
    rows, cols = np.mgrid[0:128, 0:64]
    selected = np.where(cols <= rows, a, np.float32(-9.0))
    for apply in (True, False):
        expected = selected * 2 if apply else selected.copy()
        expected[:64] += 100
        for got in _both(masked_updates, a, apply):
            np.testing.assert_array_equal(got, expected)


def test_one_element_indexed_by_integers_is_written_in_place() -> None:
    # AWS's mixed-precision flash-attention backward writes single elements (``t[i, j] = ...``):
    # an all-integer index must address the tile's element, not a copy of its value.
    @nki.jit
    def exp_one_element(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        tile = nl.load(x)
        tile[1, 2] = nl.exp(tile[1, 2])
        nl.store(out, tile)
        return out

    x = RNG.standard_normal((4, 4)).astype(np.float32)
    expected = x.copy()
    expected[1, 2] = np.exp(x[1, 2])
    for got in _both(exp_one_element, x):
        np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_tiles_dead_before_the_next_generation_do_not_count_toward_capacity() -> None:
    # AWS's flash-attention backward and select-and-scatter rebind loop variables: Python still
    # names the last generation when the next is allocated, where the NKI compiler has freed
    # it at its last use. Each (128, 40000) float32 tile takes 160,000 of trn2's 229,376 bytes
    # per partition: two at once would not fit.
    @nki.jit
    def rebinds_a_large_tile(x):
        out = nl.ndarray((128, 40000), dtype=nl.float32, buffer=nl.shared_hbm)
        sums = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        tile = None
        for _ in range(3):
            tile = nl.load(x)  # the previous tile is still named here
            acc[...] = nl.add(acc, nl.sum(tile, axis=1, keepdims=True))
        nl.store(out, tile)
        nl.store(sums, acc)
        return out, sums

    x = np.ones((128, 40000), np.float32)
    got, sums = rebinds_a_large_tile.interpret(x)
    np.testing.assert_array_equal(got, x)
    np.testing.assert_array_equal(sums, np.full((128, 1), 3 * 40000, np.float32))
    peak = rebinds_a_large_tile.last_usage.sbuf_peak_bytes_per_partition
    assert 160_000 < peak < 2 * 160_000  # one generation, and the small sums beside it


def test_direct_allocation_may_overlap_but_stays_inside() -> None:
    @nki.jit
    def overlapping_banks(x):
        out = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.shared_hbm)
        first = nl.ndarray(
            (4, nl.par_dim(128), 128), nl.float32, buffer=ncc.psum.mod_alloc(base_bank=0)
        )
        second = nl.ndarray(
            (8, nl.par_dim(128), 128), nl.float32, buffer=ncc.psum.mod_alloc(base_bank=0)
        )
        tile = nl.load(x)
        first[0] = nisa.nc_matmul(tile, tile)
        second[7] = nisa.nc_matmul(tile, tile)
        nl.store(out, value=nl.add(first[0], second[7]))
        return out

    x = RNG.standard_normal((128, 128), dtype=np.float32)
    for got in _both(overlapping_banks, x):
        np.testing.assert_allclose(got, 2 * x.T @ x, rtol=1e-5, atol=1e-3)

    @nki.jit
    def past_the_partition(x):
        tile = nl.ndarray(
            (2, nl.par_dim(128), 4096),
            nl.float32,
            buffer=ncc.sbuf.mod_alloc(base_addr=200_000, num_free_tiles=(2,)),
        )
        tile[0] = nl.load(x)
        return x

    with pytest.raises(NkiCapacityError, match=r"mod_alloc\(base_addr=200000\)"):
        past_the_partition.interpret(np.zeros((128, 4096), np.float32))


def test_benchmark_reports_the_cost_estimate_and_profile_is_refused() -> None:
    @nki.benchmark(warmup=2, iters=3)
    def add(a):
        out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.add(nl.load(a), 1.0))
        return out

    a = RNG.standard_normal((128, 512), dtype=np.float32)
    np.testing.assert_array_equal(add(a), a + 1)
    estimate = nki.estimate(nki.jit(add.kernel.fn), a)
    latency = add.benchmark_result.nc_latency
    assert latency.get_latency_percentile(50) == pytest.approx(estimate.estimated_s * 1e6)
    assert latency.get_latency_percentile(99) == latency.get_latency_percentile(1)

    traced = nki.benchmark(warmup=1, iters=1, save_trace_name="t.ntff")(add.kernel.fn)
    with pytest.raises(NkiUnsupportedError, match="records no device profile"):
        traced(a)
    profiled = nki.profile(working_directory="/tmp", save_neff_name="k.neff")(add.kernel.fn)
    with pytest.raises(NkiUnsupportedError, match="nki.profile runs a kernel on a NeuronDevice"):
        profiled(a)


CONFTEST = """
def pytest_addoption(parser):
    parser.addoption("--simulation-only", action="store_true", default=False)
"""

UNIT_TEST = """
import numpy as np
from neuronxcc.nki import simulate_kernel
from nki_samples.reference.kernels import double, broken

def test_double_numeric():
    a = np.arange(128 * 8, dtype=np.float32).reshape(128, 8)
    np.testing.assert_array_equal(simulate_kernel(double, a), 2 * a)

def test_broken_numeric():
    simulate_kernel(broken, np.zeros((128, 8), np.float32))
"""

KERNELS = """
import neuronxcc.nki as nki
import neuronxcc.nki.language as nl

@nki.jit
def double(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.multiply(nl.load(a), 2.0))
    return out

@nki.jit
def broken(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.load(a[0:256, :]))
    return out
"""

TUTORIAL = """
import numpy as np
import neuronxcc.nki as nki
import neuronxcc.nki.language as nl

@nki.jit
def negate(a):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.negative(nl.load(a)))
    return out

if __name__ == "__main__":
    a = np.ones((128, 16), np.float32)
    assert np.array_equal(negate(a), -a)
"""


def test_samples_command_on_a_checkout_laid_out_as_aws(tmp_path: Path) -> None:
    files = {
        "test/unit/conftest.py": CONFTEST,
        "test/unit/test_kernels.py": UNIT_TEST,
        "src/nki_samples/__init__.py": "",
        "src/nki_samples/reference/__init__.py": "",
        "src/nki_samples/reference/kernels.py": KERNELS,
        "src/nki_samples/tutorials/negate/negate_nki_kernels.py": TUTORIAL,
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    done = subprocess.run(
        [sys.executable, "-m", "torchneuron.nki.samples", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stdout + done.stderr  # one sample fails
    rows = {line.split(" | ")[0].strip("| "): line for line in done.stdout.splitlines()}
    assert "| passed | passed |" in rows["test_kernels.py::test_double_numeric"]
    broken = rows["test_kernels.py::test_broken_numeric"]
    assert "| failed | failed |" in broken and "exceeds the NeuronCore's 128 partitions" in broken
    tutorial = "src/nki_samples/tutorials/negate/negate_nki_kernels.py"
    assert "| passed | passed |" in rows[tutorial]
    assert "interpret: 2 of 3 passed" in done.stdout and "compiled: 2 of 3 passed" in done.stdout
    assert (
        subprocess.run(
            [sys.executable, "-m", "torchneuron.nki.samples", str(tmp_path / "src")],
            capture_output=True,
        ).returncode
        == 2
    )


API_EXAMPLE = """
import unittest
import numpy as np
import neuronxcc.nki as nki
import neuronxcc.nki.isa as nisa
import neuronxcc.nki.language as nl

@nki.jit(mode="simulation")
def top(a_tensor):
    out = nl.ndarray([a_tensor.shape[0], 8], dtype=a_tensor.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nisa.max8(src=nl.load(a_tensor)))
    return out

class TestTop(unittest.TestCase):
    def test_max8(self):
        a = np.random.random_sample([16, 64]).astype(np.float32)
        self.assertTrue(np.allclose(top(a), -np.sort(-a, axis=1)[:, :8]))
"""


def test_samples_command_on_the_api_examples_of_an_aws_neuron_sdk_checkout(tmp_path: Path) -> None:
    """aws-neuron-sdk's nki/test layout: unittest files; a module that cannot be imported is
    reported and the others still run."""
    (tmp_path / "nki" / "test").mkdir(parents=True)
    (tmp_path / "nki" / "test" / "test_top.py").write_text(textwrap.dedent(API_EXAMPLE))
    (tmp_path / "nki" / "test" / "test_gone.py").write_text("import neuronxcc.nki.missing\n")
    done = subprocess.run(
        [sys.executable, "-m", "torchneuron.nki.samples", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "aws-neuron/aws-neuron-sdk (nki/test)" in done.stdout
    rows = {line.split(" | ")[0].strip("| "): line for line in done.stdout.splitlines()}
    assert "| passed | passed |" in rows["test_top.py::test_max8"]
    assert "| error | error |" in rows["test_gone.py"]
    assert "interpret: 1 of 2 passed" in done.stdout and "compiled: 1 of 2 passed" in done.stdout
