"""``nisa``'s selection instructions (isa_selection.py) and the Vector Engine accumulator
(isa_accumulate.py) against numpy, in the interpreter and the compiled path (a launch that
uses the accumulator is traced on each call). AWS's API examples (aws-neuron-sdk nki/test,
run by ``python -m torchneuron.nki.samples``) found them missing; these tests are our own."""

from __future__ import annotations

import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki import NkiError

RNG = np.random.default_rng(21)


def _runs(kernel):
    return (kernel.interpret, kernel, kernel)


@nki.jit
def top8(x):
    """max8, then where those values are (nc_find_index8), then x with them replaced by -1
    and where they were (nc_match_replace8)."""
    rows = x.shape[0]
    values = nl.ndarray((rows, 8), dtype=nl.float32, buffer=nl.shared_hbm)
    found = nl.ndarray((rows, 8), dtype=nl.uint32, buffer=nl.shared_hbm)
    replaced = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    matched = nl.ndarray((rows, 8), dtype=nl.uint32, buffer=nl.shared_hbm)
    tile = nl.load(x)
    top = nl.ndarray((rows, 8), dtype=nl.float32, buffer=nl.sbuf)
    nisa.max8(dst=top, src=tile)
    where = nl.ndarray((rows, 8), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.nc_find_index8(dst=where, data=tile, vals=top)
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    idx = nl.ndarray((rows, 8), dtype=nl.uint32, buffer=nl.sbuf)
    nisa.nc_match_replace8(dst=out, data=tile, vals=top, imm=-1.0, dst_idx=idx)
    nl.store(values, value=top)
    nl.store(found, value=where)
    nl.store(replaced, value=out)
    nl.store(matched, value=idx)
    return values, found, replaced, matched


def test_top8_values_their_positions_and_their_replacement() -> None:
    for run in _runs(top8):
        x = RNG.standard_normal((128, 300)).astype(np.float32)
        values, found, replaced, matched = run(x)
        order = np.argsort(-x, axis=1, kind="stable")[:, :8]
        np.testing.assert_array_equal(values, np.take_along_axis(x, order, axis=1))
        np.testing.assert_array_equal(found, order)
        np.testing.assert_array_equal(matched, order)
        expected = x.copy()
        np.put_along_axis(expected, order, -1.0, axis=1)
        np.testing.assert_array_equal(replaced, expected)


def test_repeated_values_pair_with_their_matches_as_nki_08_documents() -> None:
    """The documentation's example: data [1, 2, 3, 4, 8 x 7], vals [3, 8 x 7]:
    nc_match_replace8 gives [2, 10, 9, 8, 7, 6, 5, 4], nc_find_index8 [2, 4, 5, ..., 10]; a
    value not present gives the all-ones index."""
    data = np.array([[1, 2, 3, 4] + [8] * 7], np.float32).repeat(2, axis=0)
    vals = np.array([[3] + [8] * 7, [3, 8, 8, 8, 8, 8, 8, 5]], np.float32)
    _, found, replaced, matched = _pair(data, vals)
    np.testing.assert_array_equal(matched[0], [2, 10, 9, 8, 7, 6, 5, 4])
    np.testing.assert_array_equal(found[0], [2, 4, 5, 6, 7, 8, 9, 10])
    assert found[1, 7] == 0xFFFFFFFF and matched[1, 7] == 0xFFFFFFFF
    np.testing.assert_array_equal(replaced[0], [1, 2, -1, 4] + [-1] * 7)


def _pair(data, vals):
    @nki.jit
    def kernel(d, v):
        found = nl.ndarray(v.shape, dtype=nl.uint32, buffer=nl.shared_hbm)
        replaced = nl.ndarray(d.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        matched = nl.ndarray(v.shape, dtype=nl.uint32, buffer=nl.shared_hbm)
        dt, vt = nl.load(d), nl.load(v)
        nl.store(found, value=nisa.nc_find_index8(data=dt, vals=vt))  # the legacy form
        idx = nl.ndarray(v.shape, dtype=nl.uint32, buffer=nl.sbuf)
        nl.store(replaced, value=nisa.nc_match_replace8(data=dt, vals=vt, imm=-1.0, dst_idx=idx))
        nl.store(matched, value=idx)
        return None, found, replaced, matched

    return kernel(data, vals)


def test_top8_rules_are_enforced() -> None:
    @nki.jit
    def small(x):
        nisa.max8(src=nl.load(x))
        return x

    with pytest.raises(NkiError, match="4 elements per partition; the instruction reads 8"):
        small(np.zeros((8, 4), np.float32))


def test_tensor_copy_predicated_copies_where_the_predicate_holds() -> None:
    @nki.jit
    def kernel(x, pred, base):
        out = nl.ndarray((2,) + x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        p = nl.load(pred)
        first = nl.load(base)
        nisa.tensor_copy_predicated(dst=first, src=nl.load(x), predicate=p)
        second = nl.load(base)
        nisa.tensor_copy_predicated(dst=second, src=7.0, predicate=p, reverse_pred=True)
        nl.store(out[0], value=first)
        nl.store(out[1], value=second)
        return out

    for run in _runs(kernel):
        x, base = RNG.standard_normal((2, 128, 64)).astype(np.float32)
        pred = (RNG.random((128, 64)) > 0.5).astype(np.uint8)
        out = run(x, pred, base)
        np.testing.assert_array_equal(out[0], np.where(pred != 0, x, base))
        np.testing.assert_array_equal(out[1], np.where(pred == 0, 7.0, base))


def test_cumulative_runs_and_the_accumulator_carries_between_instructions() -> None:
    """Running sum of 2x (op0 multiply, op1 add), reset; the same continued (reduce) from
    where it stopped; a running maximum from imm1 (load_reduce)."""

    @nki.jit
    def kernel(x, start):
        out = nl.ndarray((3,) + x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        tile = nl.load(x)
        steps = [nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf) for _ in range(3)]
        nisa.tensor_scalar_cumulative(
            dst=steps[0], src=tile, op0=nl.multiply, op1=nl.add, imm0=2.0,
            reduce_cmd=nisa.reduce_cmd.reset_reduce,
        )  # fmt: skip
        nisa.tensor_scalar_cumulative(
            dst=steps[1], src=tile, op0=nl.multiply, op1=nl.add, imm0=2.0,
            reduce_cmd=nisa.reduce_cmd.reduce,
        )  # fmt: skip
        nisa.tensor_scalar_cumulative(
            dst=steps[2], src=tile, op0=nl.add, op1=nl.maximum, imm0=0.0, imm1=nl.load(start),
            reduce_cmd=nisa.reduce_cmd.load_reduce,
        )  # fmt: skip
        for n in range(3):
            nl.store(out[n], value=steps[n])
        return out

    for run in _runs(kernel):
        x = RNG.standard_normal((128, 40)).astype(np.float32)
        start = RNG.standard_normal((128, 1)).astype(np.float32)
        out = run(x, start)
        running = np.cumsum(2 * x, axis=1, dtype=np.float64)
        np.testing.assert_allclose(out[0], running, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(out[1], running + running[:, -1:], rtol=1e-5, atol=1e-5)
        expected = np.maximum.accumulate(np.concatenate([start, x], axis=1), axis=1)[:, 1:]
        np.testing.assert_array_equal(out[2], expected)


def test_select_reduce_and_range_select_keep_a_running_maximum(monkeypatch) -> None:
    """select_reduce into the accumulator (reset, then reduce over a second tile), its
    maximum written out; range_select keeps the columns in [low, high) and takes their max."""
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2")

    @nki.jit
    def kernel(a, b, pred, low, high):
        out = nl.ndarray((2,) + a.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        maxima = nl.ndarray((a.shape[0], 2), dtype=nl.float32, buffer=nl.shared_hbm)
        p = nl.load(pred)
        first = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.select_reduce(
            dst=first, predicate=p, on_true=nl.load(a), on_false=-5.0,
            reduce_cmd=nisa.reduce_cmd.reset_reduce,
        )  # fmt: skip
        running = nl.ndarray((a.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        second = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        nisa.select_reduce(
            dst=second, predicate=p, on_true=nl.load(b), on_false=-5.0, reduce_res=running,
            reduce_cmd=nisa.reduce_cmd.reduce, reverse_pred=True,
        )  # fmt: skip
        ranged = nl.ndarray(a.shape, dtype=nl.float32, buffer=nl.sbuf)
        best = nl.ndarray((a.shape[0], 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.range_select(
            dst=ranged, on_true_tile=nl.load(a), comp_op0=nl.greater_equal,
            comp_op1=nl.less, bound0=nl.load(low), bound1=nl.load(high), reduce_res=best,
        )  # fmt: skip
        nl.store(out[0], value=second)
        nl.store(out[1], value=ranged)
        nl.store(maxima[:, 0:1], value=running)
        nl.store(maxima[:, 1:2], value=best)
        return out, maxima

    for run in _runs(kernel):
        a, b = RNG.standard_normal((2, 128, 32)).astype(np.float32)
        pred = (RNG.random((128, 32)) > 0.5).astype(np.uint8)
        low = RNG.integers(0, 10, size=(128, 1)).astype(np.float32)
        high = low + RNG.integers(1, 20, size=(128, 1)).astype(np.float32)
        out, maxima = run(a, b, pred, low, high)
        first = np.where(pred != 0, a, -5.0)
        second = np.where(pred == 0, b, -5.0)
        np.testing.assert_array_equal(out[0], second)
        np.testing.assert_array_equal(
            maxima[:, 0], np.maximum(first.max(axis=1), second.max(axis=1))
        )
        column = np.arange(32)[None, :]
        inside = (column >= low) & (column < high)
        fill = np.finfo(np.float32).min
        np.testing.assert_array_equal(out[1], np.where(inside, a, fill))
        np.testing.assert_array_equal(maxima[:, 1], np.where(inside, a, fill).max(axis=1))


def test_range_select_is_neuroncore_v3_and_newer(monkeypatch) -> None:
    monkeypatch.setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1")

    @nki.jit
    def kernel(a, bound):
        t, b = nl.load(a), nl.load(bound)
        nisa.range_select(on_true_tile=t, comp_op0=nl.less, comp_op1=nl.less, bound0=b, bound1=b)
        return a

    with pytest.raises(NkiError, match=r"NeuronCore-v3 \(trn2\) and newer; the target is trn1"):
        kernel(np.zeros((4, 8), np.float32), np.zeros((4, 1), np.float32))


def test_helpers_the_legacy_examples_rely_on() -> None:
    """shared_identity_matrix loads as the legacy API's HBM constant; an HBM tensor is
    truthy (``if optional_input:``), an on-chip tile's value is not; nl.rand defaults to
    float32; tensor_tensor_scan takes a (partitions,) column as its initial value."""

    @nki.jit
    def kernel(x, absent_or_present):
        out = nl.ndarray((3,) + x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        identity = nl.load(nl.shared_identity_matrix(n=x.shape[0], dtype=nl.float32))
        nl.store(out[0], value=identity)
        tile = nl.load(x)
        offset = nl.load(absent_or_present) if absent_or_present else nl.zeros_like(tile)
        scanned = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
        scanned[...] = nisa.tensor_tensor_scan(
            tile, offset, initial=tile[:, 0], op0=np.add, op1=np.add
        )
        nl.store(out[1], value=scanned)
        nl.store(out[2], value=nl.rand(x.shape))
        return out

    x = RNG.standard_normal((16, 16)).astype(np.float32)
    ones = np.ones_like(x)
    out = kernel(x, ones)
    np.testing.assert_array_equal(out[0], np.eye(16, dtype=np.float32))
    expected = x[:, :1] + np.cumsum(x + 1.0, axis=1)
    np.testing.assert_allclose(out[1], expected, rtol=1e-5, atol=1e-5)
    assert out[2].dtype == np.float32 and 0 <= out[2].min() and out[2].max() < 1

    @nki.jit
    def branches_on_values(x):
        if nl.load(x):
            pass
        return x

    with pytest.raises(NkiError, match="values are not known while the kernel is traced"):
        branches_on_values(x)


def test_stream_shuffle_local_gather_dma_transpose_and_sequence_bounds() -> None:
    @nki.jit
    def kernel(x, table, index, ids):
        shuffled = nl.ndarray((64, 16), dtype=nl.float32, buffer=nl.shared_hbm)
        gathered = nl.ndarray((32, 6, 2), dtype=nl.float32, buffer=nl.shared_hbm)
        turned = nl.ndarray((16, 64), dtype=nl.float32, buffer=nl.shared_hbm)
        bounds = nl.ndarray((1, 2, ids.shape[1]), dtype=nl.float32, buffer=nl.shared_hbm)
        tile = nl.load(x)
        out = nl.ndarray((64, 16), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=out, value=-1.0)
        mask = [(i + 3) % 32 for i in range(31)] + [255]  # the last partition kept
        nisa.nc_stream_shuffle(dst=out, src=tile, shuffle_mask=mask)
        nl.store(shuffled, value=out)
        picked = nl.ndarray((32, 6, 2), dtype=nl.float32, buffer=nl.sbuf)
        nisa.local_gather(
            picked, nl.load(table), nl.load(index), num_elem_per_idx=2, num_valid_indices=6
        )
        nl.store(gathered, value=picked)
        nl.store(turned, value=nisa.dma_transpose(x))
        nl.store(bounds, value=nisa.sequence_bounds(segment_ids=nl.load(ids)))
        return shuffled, gathered, turned, bounds

    for run in _runs(kernel):
        x = RNG.standard_normal((64, 16)).astype(np.float32)
        table = RNG.standard_normal((32, 40)).astype(np.float32)
        index = np.tile(RNG.integers(0, 19, size=(16, 1)) * 2, (2, 1)).astype(np.uint16)
        ids = np.array([[0, 3, 3, 5, 5, 5, 0, 2]], np.float32)
        shuffled, gathered, turned, bounds = run(x, table, index, ids)
        expected = np.full((64, 16), -1.0, np.float32)
        for q in range(2):
            for i in range(31):
                expected[q * 32 + i] = x[q * 32 + (i + 3) % 32]
        np.testing.assert_array_equal(shuffled, expected)
        for core in range(2):
            rows = slice(core * 16, (core + 1) * 16)
            starts = index[rows].flatten(order="F")[:6]
            columns = (starts[:, None] + np.arange(2)).reshape(-1)
            np.testing.assert_array_equal(gathered[rows].reshape(16, -1), table[rows][:, columns])
        np.testing.assert_array_equal(turned, x.T)
        n = ids.shape[1]
        np.testing.assert_array_equal(
            bounds[0], [[n, 1, 1, 3, 3, 3, n, 7], [-1, 3, 3, 6, 6, 6, -1, 8]]
        )


def test_dropout_instruction_and_float8_tiles() -> None:
    """nisa.dropout zeroes at its rate (per partition here) and keeps the rest; a float8 tile
    rounds as its format does (ml_dtypes: e4m3 to 3 mantissa bits, up to 240; e5m2 to 2)."""

    @nki.jit
    def kernel(x, rates):
        out = nl.ndarray((3,) + x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
        tile = nl.load(x)
        nl.store(out[0], value=nisa.dropout(tile, prob=nl.load(rates)))
        for n, dtype in ((1, nl.float8_e4m3), (2, nl.float8_e5m2)):
            narrow = nl.ndarray(x.shape, dtype=dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=narrow, src=tile)
            nl.store(out[n], value=narrow)
        return out

    import ml_dtypes

    x = RNG.uniform(1, 300, size=(128, 256)).astype(np.float32)
    rates = np.where(np.arange(128) < 64, 0.0, 0.5).astype(np.float32).reshape(128, 1)
    out = kernel(x, rates)
    np.testing.assert_array_equal(out[0][:64], x[:64])
    kept = out[0][64:] != 0
    assert abs(kept.mean() - 0.5) < 0.02
    np.testing.assert_array_equal(out[0][64:][kept], x[64:][kept])
    e4m3 = x.astype(ml_dtypes.float8_e4m3).astype(np.float32)
    np.testing.assert_array_equal(out[1], e4m3)
    assert np.isinf(out[1][x > 248]).all() and np.isfinite(out[1][x < 232]).all()
    np.testing.assert_array_equal(out[2], x.astype(ml_dtypes.float8_e5m2).astype(np.float32))
