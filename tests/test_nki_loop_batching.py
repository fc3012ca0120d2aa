"""Loop batching in the compiled path (torchneuron/nki/loop_batching.py): affine_range
iterations that repeat row-wise instructions run as one call over all iterations' rows.
Batched results must equal the interpreter bit for bit; loops that do not qualify (a
carried tile, HBM read after being written, masked tails, overlapping rows) are left as
they are and still equal it."""

from __future__ import annotations

import numpy as np
import pytest
import support.nki_sample_kernels as k

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.nki import loop_batching

RNG = np.random.default_rng(11)


@pytest.fixture(autouse=True)
def _numpy_program(monkeypatch):
    """These tests read the numpy program's batched steps (bit-identical to the interpreter);
    the C++ row programs that replace them by default are tested in test_nki_row_programs.py."""
    monkeypatch.setenv("TORCHNEURON_NKI_ROW_PROGRAMS", "never")


def _compiled(kernel, *args):
    """(interpreter result, compiled result, the compiled program)."""
    expected = kernel.interpret(*args)
    kernel(*args)  # traces and compiles
    got = kernel(*args)
    program = list(kernel._cache.values())[-1].program
    return expected, got, program


def _rows(n):
    return RNG.standard_normal((n, 256), dtype=np.float32)


CASES = {
    "rmsnorm": lambda x: (k.rmsnorm_kernel, (x, RNG.standard_normal(256, dtype=np.float32), 1e-6)),
    "rmsnorm_new": lambda x: (
        k.rmsnorm_new_kernel,
        (x, RNG.standard_normal(256, dtype=np.float32), 1e-6),
    ),
    "layernorm": lambda x: (
        k.layernorm_kernel,
        (x, *RNG.standard_normal((2, 256), dtype=np.float32), 1e-5),
    ),
    "softmax": lambda x: (k.softmax_kernel, (x,)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_sample_kernels_batched_bit_identical(name, monkeypatch):
    monkeypatch.setattr(loop_batching, "CHUNK_BYTES", 1 << 40)  # one chunk: the whole loop
    kernel, args = CASES[name](_rows(1024))
    expected, got, program = _compiled(kernel, *args)
    assert program.batched_steps > 0
    np.testing.assert_array_equal(got, expected)  # bitwise: same rows, same numpy loops
    # One call per instruction whatever the number of tiles: the source does not grow.
    kernel, args = CASES[name](_rows(2048))
    _, _, longer = _compiled(kernel, *args)
    assert longer.source.count("\n") == program.source.count("\n")


@pytest.mark.parametrize("name", sorted(CASES))
def test_chunks_and_a_remainder_iteration(name, monkeypatch):
    monkeypatch.setattr(loop_batching, "CHUNK_BYTES", 1 << 40)
    kernel, args = CASES[name](_rows(3 * 128))
    _, _, whole = _compiled(kernel, *args)
    # 9 tiles of 128 KiB, batched 2 at a time: 4 batched chunks and one plain iteration.
    monkeypatch.setattr(loop_batching, "CHUNK_BYTES", 2 * 128 * 256 * 4)
    kernel, args = CASES[name](_rows(9 * 128))
    expected, got, program = _compiled(kernel, *args)
    assert program.batched_steps == 4 * whole.batched_steps > 0
    np.testing.assert_array_equal(got, expected)


def test_masked_tail_is_not_batched_and_correct():
    x = _rows(1000)  # the last tile is masked (rows 1000..1023 are outside)
    w = RNG.standard_normal(256, dtype=np.float32)
    expected, got, program = _compiled(k.rmsnorm_kernel, x, w, 1e-6)
    assert program.batched_steps == 0
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_allclose(got, k.rmsnorm_ref(x, w, 1e-6), rtol=1e-5, atol=1e-5)


@nki.jit
def _carried_tile_kernel(x):
    """Each iteration reads the running tile the previous one wrote (a carried value)."""
    n, d = x.shape
    out = nl.ndarray((128, d), dtype=x.dtype, buffer=nl.shared_hbm)
    running = nl.zeros((128, d), nl.float32)
    for t in nl.affine_range(n // 128):
        tile = nl.load(x[t * 128 : (t + 1) * 128, :])
        running[...] = nl.add(nl.multiply(running, 0.5), tile)
    nl.store(out, value=running)
    return out


@nki.jit
def _in_place_kernel(x):
    """Reads HBM the loop writes: row block t+1 takes block t's result."""
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out[0:128, :], value=nl.load(x[0:128, :]))
    for t in nl.affine_range(n // 128 - 1):
        prev = nl.load(out[t * 128 : (t + 1) * 128, :])
        nl.store(out[(t + 1) * 128 : (t + 2) * 128, :], value=nl.add(prev, 1.0))
    return out


@nki.jit
def _overlapping_rows_kernel(x):
    """Iterations read overlapping row windows (step 64, 128 rows): not one stacked slice."""
    n, d = x.shape
    out = nl.ndarray((n // 2, d), dtype=x.dtype, buffer=nl.shared_hbm)
    for t in nl.affine_range(n // 128):
        window = nl.load(x[t * 64 : t * 64 + 128, :])
        half = nl.add(window[0:64, :], window[64:128, :])
        nl.store(out[t * 64 : (t + 1) * 64, :], value=half)
    return out


@pytest.mark.parametrize(
    "kernel", [_carried_tile_kernel, _in_place_kernel, _overlapping_rows_kernel]
)
def test_loops_that_do_not_qualify_run_unbatched(kernel):
    x = _rows(512)
    expected, got, program = _compiled(kernel, x)
    assert program.batched_steps == 0
    np.testing.assert_array_equal(got, expected)


@nki.jit
def _wide_operands_kernel(x, bias):
    """Per-partition bias and a full [128, d] tile computed before the loop, read by every
    iteration: the ufunc path broadcasts them per iteration, the generic path (activation)
    repeats them."""
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    b = nl.load(bias)  # [128, 1]
    offsets = nl.multiply(nl.load(x[0:128, :]), 0.25)  # [128, d]
    for t in nl.affine_range(n // 128):
        tile = nl.load(x[t * 128 : (t + 1) * 128, :])
        shifted = nisa.activation(op=nl.exp, data=tile, bias=b, scale=0.5)
        nl.store(out[t * 128 : (t + 1) * 128, :], value=nl.subtract(shifted, offsets))
    return out


def test_wide_loop_invariant_operands():
    x = _rows(512)
    bias = RNG.standard_normal((128, 1), dtype=np.float32)
    expected, got, program = _compiled(_wide_operands_kernel, x, bias)
    assert program.batched_steps > 0
    assert "_repeat(" in program.source  # activation (not a ufunc) gets the bias repeated
    np.testing.assert_array_equal(got, expected)
    rows = np.tile(bias, (4, 1))
    reference = np.exp(x * 0.5 + rows) - np.tile(x[:128] * 0.25, (4, 1))
    np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-5)


def test_strided_input_at_run_time():
    """The stacked access is replayed from index keys, so an input with other strides than
    the traced one (same signature) reads the right rows."""
    x = _rows(512)
    expected, _, _ = _compiled(k.softmax_kernel, x)
    wide = np.zeros((512, 512), np.float32)
    wide[:, ::2] = x
    np.testing.assert_array_equal(k.softmax_kernel(wide[:, ::2]), expected)


def test_loads_read_from_hbm_directly():
    """A float32 tile loaded whole from an input nobody writes is read from the input: the
    copy is gone from the generated code, results stay bit-identical."""
    x = _rows(512)
    expected, got, program = _compiled(k.softmax_kernel, x)
    assert "a0[" in program.source
    assert not any("np.copyto(" in line and ", a0[" in line for line in program.source.split("\n"))
    np.testing.assert_array_equal(got, expected)


@nki.jit
def _overwrites_input_kernel(x):
    """Loads a tile, then overwrites the input it came from: the tile keeps the old values."""
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    tile = nl.load(x)
    nl.store(x, value=nl.multiply(tile, 3.0))
    nl.store(out, value=nl.add(tile, nl.load(x)))
    return out


@nki.jit
def _rewritten_tile_kernel(x):
    """A loaded tile written again: it is the kernel's own copy, not the input."""
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    tile = nl.load(x)
    tile[...] = nl.exp(tile)
    nl.store(out, value=nl.add(tile, nl.load(x)))
    return out


@pytest.mark.parametrize("kernel", [_overwrites_input_kernel, _rewritten_tile_kernel])
def test_loads_that_must_stay_copies(kernel):
    x = RNG.standard_normal((128, 64), dtype=np.float32)
    expected = kernel.interpret(x.copy())
    kernel(x.copy())
    got = kernel(x.copy())
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_allclose(
        expected, 4 * x if kernel is _overwrites_input_kernel else np.exp(x) + x, rtol=1e-6
    )


def test_results_written_to_the_output_directly():
    """The last instruction writes the output rows itself (no tile copied by the store)."""
    x = _rows(512)
    expected, got, program = _compiled(k.softmax_kernel, x)
    assert "out=o0[" in program.source
    assert not any(line.strip().startswith("np.copyto(o0[") for line in program.source.split("\n"))
    np.testing.assert_array_equal(got, expected)


@nki.jit
def _stored_tile_read_again_kernel(x):
    """The stored tile is read again after the store: it must stay a tile."""
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    twice = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    y = nl.exp(nl.load(x))
    nl.store(out, value=y)
    nl.store(twice, value=nl.add(y, y))
    return out, twice


@nki.jit
def _output_written_in_between_kernel(x):
    """The output is written and read between the tile's producer and its store: the
    producer must not write the output early."""
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    seen = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    y = nl.exp(nl.load(x))
    nl.store(out, value=nl.multiply(nl.load(x), 2.0))
    nl.store(seen, value=nl.load(out))
    nl.store(out, value=y)
    return out, seen


@pytest.mark.parametrize(
    "kernel", [_stored_tile_read_again_kernel, _output_written_in_between_kernel]
)
def test_stores_that_must_stay_copies(kernel):
    x = RNG.standard_normal((128, 64), dtype=np.float32)
    expected = kernel.interpret(x)
    kernel(x)
    got = kernel(x)
    expected = expected if isinstance(expected, tuple) else (expected,)
    got = got if isinstance(got, tuple) else (got,)
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_array_equal(g, e)
    if kernel is _output_written_in_between_kernel:
        np.testing.assert_allclose(got[0], np.exp(x), rtol=1e-6)
        np.testing.assert_array_equal(got[1], 2 * x)
    else:
        np.testing.assert_allclose(got[1], 2 * np.exp(x), rtol=1e-6)
