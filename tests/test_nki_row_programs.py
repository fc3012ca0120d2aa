"""C++ row programs (torchneuron/nki/row_programs.py): every lowered instruction kind against
the interpreter, the cases that must stay numpy or fall back, and the library cache.

Kernels here are our own, written from AWS's public NKI documentation. The mode is
``always`` (every run lowered, whatever its size) unless a test says otherwise. Tolerances:
row programs reassociate float32 sums and compute exp as a polynomial (<= 2 ulp), so they
agree with the interpreter to rtol 1e-5 / atol 1e-6 (1e-5 where a sum feeds a division)."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl
from torchneuron.compile.cache_trust import NeffCacheSecurityError
from torchneuron.nki import cxx_build, row_programs

RNG = np.random.default_rng(7)
ROWS, COLS = 256, 384


@pytest.fixture(autouse=True)
def _always(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHNEURON_NKI_ROW_PROGRAMS", "always")
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path / "cache"))


def _run(kernel, *args):
    """(interpreter result, compiled result, compiled program)."""
    expected = kernel.interpret(*args)
    kernel(*args)  # traces and compiles
    got = kernel(*args)
    program = list(kernel._cache.values())[-1].program
    return expected, got, program


def _x(rows=ROWS, cols=COLS, special=True):
    x = RNG.standard_normal((rows, cols), dtype=np.float32) * 3
    if special:  # IEEE specials flow as numpy's do
        x[0, :4] = [np.nan, np.inf, -np.inf, 0.0]
        x[1, :] = -np.inf
    return x


def _close(got, expected, rtol=1e-5, atol=1e-6):
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, equal_nan=True)


UNARY = [
    "exp", "log", "sqrt", "rsqrt", "reciprocal", "square", "abs", "negative", "sin", "cos",
    "tanh", "arctan", "sigmoid", "relu", "gelu", "gelu_apprx_tanh", "erf", "sign", "floor",
    "ceil", "trunc", "silu",
]  # fmt: skip


@pytest.mark.parametrize("op", UNARY)
def test_unary_ops(op):
    fn = getattr(nl, op)

    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        for t in nl.affine_range(x.shape[0] // 128):
            tile = nl.load(x[t * 128 : (t + 1) * 128, :])
            nl.store(out[t * 128 : (t + 1) * 128, :], value=fn(tile))
        return out

    x = _x()
    if op in ("log", "sqrt", "rsqrt"):
        x = np.abs(x)
    expected, got, program = _run(kernel, x)
    assert program.row_programs == 1
    _close(got, expected)


def test_exp_over_the_whole_float32_range():
    """Near the top of its range exp's polynomial scales by 2^128, past float32's largest
    exponent: exp(88.5) = 2.7e38 came out inf (AWS's memory-semantics example, whose inputs
    reach 100, caught it). Every value from below the smallest normal result to past
    overflow against numpy (results under 1.2e-38 flush to zero, inside atol)."""

    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.exp(nl.load(x)))
        return out

    x = np.linspace(-104.0, 89.5, 128 * 512, dtype=np.float32).reshape(128, 512)
    expected, got, program = _run(kernel, x)
    assert program.row_programs == 1
    with np.errstate(over="ignore"):
        _close(got, np.exp(x))
    _close(got, expected)
    assert np.isfinite(got[x < 88.72]).all() and np.isinf(got[x > 88.73]).all()


@pytest.mark.parametrize("op", ["add", "subtract", "multiply", "divide", "maximum", "minimum"])
def test_binary_ops_with_broadcast_operands(op):
    fn = getattr(nl, op)

    @nki.jit
    def kernel(x, col, row):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        per_row = nl.load(row)  # [128, 1]: one value per partition
        per_col = nl.broadcast_to(nl.load(col), shape=(128, x.shape[1]))  # [1, F] repeated
        for t in nl.affine_range(x.shape[0] // 128):
            tile = nl.load(x[t * 128 : (t + 1) * 128, :])
            a = fn(tile, per_row)
            b = fn(a, per_col)
            nl.store(out[t * 128 : (t + 1) * 128, :], value=fn(b, 0.5))
        return out

    x, col, row = _x(), _x(1, COLS, special=False), _x(128, 1, special=False)
    expected, got, program = _run(kernel, x, col, row)
    assert program.row_programs >= 1
    _close(got, expected)


def test_reductions_means_and_negated_tensor_reduce():
    @nki.jit
    def kernel(x):
        out = nl.ndarray((x.shape[0], 5), dtype=x.dtype, buffer=nl.shared_hbm)
        for t in nl.affine_range(x.shape[0] // 128):
            tile = nl.load(x[t * 128 : (t + 1) * 128, :])
            res = nl.ndarray((128, 5), dtype=nl.float32, buffer=nl.sbuf)
            res[:, 0:1] = nl.max(tile, axis=[1], keepdims=True)
            res[:, 1:2] = nl.min(tile, axis=[1], keepdims=True)
            res[:, 2:3] = nl.sum(tile, axis=[1], keepdims=True)
            res[:, 3:4] = nl.mean(tile, axis=[1], keepdims=True)
            nisa.tensor_reduce(dst=res[:, 4:5], op=nl.add, data=tile, axis=[1], negate=True)
            nl.store(out[t * 128 : (t + 1) * 128, :], value=res)
        return out

    x = _x()
    expected, got, program = _run(kernel, x)
    assert program.row_programs >= 1
    assert np.isnan(got[0, 0]) and np.isnan(expected[0, 0])  # NaN propagates through max
    np.testing.assert_array_equal(got[:, :2], expected[:, :2])  # max/min: no rounding
    # a 384-term sum of |x| <~ 10 reassociated: error <= 384 * 6e-8 * 10 ~ 2.3e-4
    _close(got, expected, rtol=1e-5, atol=3e-4)


@pytest.mark.parametrize("reduce", [None, nl.add, nl.maximum])
@pytest.mark.parametrize("tile_scale", [True, False])
def test_activation_with_scale_bias_and_reduce(reduce, tile_scale):
    @nki.jit
    def kernel(x, s, b):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        red = nl.ndarray((x.shape[0], 1), dtype=x.dtype, buffer=nl.shared_hbm)
        scale = nl.load(s) if tile_scale else 0.75
        bias = nl.load(b)
        for t in nl.affine_range(x.shape[0] // 128):
            tile = nl.load(x[t * 128 : (t + 1) * 128, :])
            y = nl.ndarray((128, x.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
            total = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
            if reduce is None:
                nisa.activation(dst=y, op=nl.tanh, data=tile, scale=scale, bias=bias)
                nisa.memset(dst=total, value=0.0)
            else:
                nisa.activation(
                    dst=y, op=nl.exp, data=tile, scale=scale, bias=bias, reduce_op=reduce,
                    reduce_res=total,
                )  # fmt: skip
            nl.store(out[t * 128 : (t + 1) * 128, :], value=y)
            nl.store(red[t * 128 : (t + 1) * 128, :], value=total)
        return out, red

    x = _x(special=False) * 0.3
    s, b = _x(128, 1, special=False), _x(128, 1, special=False)
    expected, got, program = _run(kernel, x, s, b)
    assert program.row_programs >= 1
    _close(got[0], expected[0])
    _close(got[1], expected[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reverse0,reverse1", [(False, False), (True, False), (False, True)])
def test_tensor_scalar_operand_orders(reverse0, reverse1):
    @nki.jit
    def kernel(x, v):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        per_row = nl.load(v)
        for t in nl.affine_range(x.shape[0] // 128):
            tile = nl.load(x[t * 128 : (t + 1) * 128, :])
            y = nl.ndarray((128, x.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_scalar(
                y, tile, nl.subtract, per_row, reverse0=reverse0, op1=nl.divide, operand1=1.5,
                reverse1=reverse1,
            )  # fmt: skip
            nl.store(out[t * 128 : (t + 1) * 128, :], value=y)
        return out

    x, v = _x(special=False), _x(128, 1, special=False)
    expected, got, program = _run(kernel, x, v)
    assert program.row_programs >= 1
    _close(got, expected)


@pytest.mark.parametrize("cols", [999, 512, 7])
def test_bn_stats_and_bn_aggr_chunks_of_odd_sizes(cols):
    chunk = nl.tile_size.bn_stats_fmax

    @nki.jit
    def kernel(x):
        n, d = x.shape
        chunks = (d + chunk - 1) // chunk
        out = nl.ndarray((n, 2), dtype=x.dtype, buffer=nl.shared_hbm)
        for t in nl.affine_range(n // 128):
            tile = nl.load(x[t * 128 : (t + 1) * 128, :])
            stats = nl.ndarray((128, 6 * chunks), dtype=nl.float32, buffer=nl.sbuf)
            for c in nl.static_range(chunks):
                width = min(chunk, d - c * chunk)
                nisa.bn_stats(
                    dst=stats[:, 6 * c : 6 * (c + 1)], data=tile[:, c * chunk : c * chunk + width]
                )
            mean_var = nl.ndarray((128, 2), dtype=nl.float32, buffer=nl.sbuf)
            nisa.bn_aggr(dst=mean_var, data=stats)
            nl.store(out[t * 128 : (t + 1) * 128, :], value=mean_var)
        return out

    x = _x(cols=cols, special=False) + 2.0
    expected, got, program = _run(kernel, x)
    assert program.row_programs >= 1
    _close(got, expected, rtol=1e-5, atol=1e-5)
    _close(got[:, 0], x.mean(1), rtol=1e-5, atol=1e-5)
    _close(got[:, 1], x.var(1), rtol=1e-4, atol=1e-5)


def test_softmax_with_infinities_and_nan():
    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        for t in nl.affine_range(x.shape[0] // 128):
            tile = nl.load(x[t * 128 : (t + 1) * 128, :])
            nl.store(out[t * 128 : (t + 1) * 128, :], value=nl.softmax(tile, axis=[1]))
        return out

    x = _x()
    x[2, 5:] = -np.inf  # a row with a few finite entries
    expected, got, program = _run(kernel, x)
    assert program.row_programs == 1
    assert np.isnan(got[0]).all() and np.isnan(got[1]).all()  # NaN / all -inf rows
    _close(got, expected)


def test_row_read_at_another_position_keeps_program_order():
    # Every row adds row 0 of a tile that the same loop overwrites: running instruction by
    # instruction, all rows see the old row 0; row by row they would not. The run must split.
    @nki.jit
    def kernel(x):
        out = nl.ndarray((128, x.shape[1]), dtype=x.dtype, buffer=nl.shared_hbm)
        acc = nl.ndarray((128, x.shape[1]), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=acc, src=x[0:128, :])
        first = acc[0:1, :]
        total = nl.add(acc, nl.broadcast_to(first, shape=(128, x.shape[1])))
        acc[...] = nl.multiply(total, 2.0)
        again = nl.add(acc, nl.broadcast_to(acc[0:1, :], shape=(128, x.shape[1])))
        nl.store(out, value=again)
        return out

    x = _x(special=False)
    expected, got, _ = _run(kernel, x)
    _close(got, expected)
    _close(got, 2 * (x[:128] + x[0]) + 2 * (x[0] + x[0]))


def test_strided_hbm_input_gets_its_own_program():
    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        for t in nl.affine_range(x.shape[0] // 128):
            tile = nl.load(x[t * 128 : (t + 1) * 128, :])
            nl.store(out[t * 128 : (t + 1) * 128, :], value=nl.exp(tile))
        return out

    wide = _x(cols=2 * COLS, special=False)
    contiguous = np.ascontiguousarray(wide[:, ::2])
    first = kernel(contiguous)
    strided = kernel(wide[:, ::2])  # same shape, other strides: a program of its own
    assert len(kernel._cache) == 2
    assert all(entry.program.row_programs == 1 for entry in kernel._cache.values())
    _close(first, np.exp(contiguous))
    _close(strided, first)
    transposed = np.ascontiguousarray(wide[:, :COLS].T).T  # column-major rows
    _close(kernel(transposed), np.exp(transposed))


def test_partially_written_output_is_zero_elsewhere():
    """The compiled program's output is zero where the kernel never wrote it (reused memory
    leaks nothing between calls); the interpreter shows such elements as NaN, as AWS's
    simulator does, since on the chip they are undefined."""

    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        tile = nl.load(x[0:128, :])
        nl.store(out[0:128, :], value=nl.square(tile))
        return out

    x = _x(special=False)
    for _ in range(3):  # fresh, reused memory: the unwritten rows must still be zero
        expected, got, _ = _run(kernel, x)
        np.testing.assert_array_equal(got[128:], 0.0)
        assert np.isnan(expected[128:]).all()
        _close(got[:128], expected[:128])


def test_small_runs_stay_numpy_in_auto_mode(monkeypatch):
    monkeypatch.setenv("TORCHNEURON_NKI_ROW_PROGRAMS", "auto")

    @nki.jit
    def kernel(x):
        out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
        nl.store(out, value=nl.exp(nl.load(x)))
        return out

    small, large = _x(128, 64, special=False), _x(128, 1024, special=False)
    kernel(small)
    assert list(kernel._cache.values())[-1].program.row_programs == 0  # 8192 elements
    _close(kernel(large), np.exp(large))
    assert list(kernel._cache.values())[-1].program.row_programs == 1  # 131072 elements


def test_mode_never_and_a_bad_mode(monkeypatch):
    monkeypatch.setenv("TORCHNEURON_NKI_ROW_PROGRAMS", "never")
    x = _x(128, COLS, special=False)
    _, got, program = _run(nki.jit(_exp_kernel), x)
    assert program.row_programs == 0
    _close(got, np.exp(x))
    monkeypatch.setenv("TORCHNEURON_NKI_ROW_PROGRAMS", "sometimes")
    with pytest.raises(ValueError, match="TORCHNEURON_NKI_ROW_PROGRAMS='sometimes'"):
        row_programs.mode()


def _exp_kernel(x):
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    nl.store(out, value=nl.exp(nl.load(x[0:128, :])))
    return out


def test_libraries_are_cached_owner_only(tmp_path):
    kernel = nki.jit(_exp_kernel)
    x = _x(128, COLS, special=False)
    _close(kernel(x), np.exp(x))
    libraries = list((tmp_path / "cache" / cxx_build.SUBDIR).glob("*.so"))
    assert len(libraries) == 1
    for path in [libraries[0], libraries[0].parent]:
        assert stat.S_IMODE(os.stat(path).st_mode) & 0o077 == 0, path


def test_untrusted_cache_directory_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(cxx_build, "_loaded", {})  # not already loaded by this process
    directory = tmp_path / "cache" / cxx_build.SUBDIR
    directory.mkdir(parents=True, mode=0o700)
    os.chmod(directory, 0o777)  # anyone could plant a library here
    with pytest.raises(NeffCacheSecurityError, match="writable by"):
        nki.jit(_exp_kernel)(_x(128, COLS, special=False))


def test_missing_compiler_warns_and_runs_numpy(monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    monkeypatch.setattr(cxx_build, "_loaded", {})
    cxx_build._compiler.cache_clear()
    try:
        kernel = nki.jit(_exp_kernel)
        x = _x(128, COLS, special=False)
        with pytest.warns(RuntimeWarning, match="NKI row programs run as numpy"):
            got = kernel(x)
        assert list(kernel._cache.values())[-1].program.row_programs == 0
        _close(got, np.exp(x))
    finally:
        cxx_build._compiler.cache_clear()


@pytest.mark.parametrize("order", ["descending", "ascending"])
@pytest.mark.parametrize("moving_layout", ["rows", "columns"])
def test_matmul_accumulate_transpose_and_fills(moving_layout, order, monkeypatch):
    # scores = q^T k (dot-product form when k is column-major, axpy form otherwise), a PSUM
    # accumulation of two products over transposed score blocks and a memset, all inside row
    # programs. Blocks taken in descending order stay two products and two transposes;
    # ascending, they are consecutive column blocks and fuse into one product of the scores
    # themselves (fusion.fused_matmul_nt_fn, lowered as "matmul_nt").
    blocks = [1, 0] if order == "descending" else [0, 1]
    sources: list[str] = []  # the row programs' C++, as built
    build = cxx_build.load
    monkeypatch.setattr(
        cxx_build, "load", lambda source: (sources.append(source), build(source))[1]
    )

    @nki.jit
    def kernel(q_t, k_t, v):
        d, n = q_t.shape
        out = nl.ndarray((n, v.shape[1]), dtype=v.dtype, buffer=nl.shared_hbm)
        scores = nisa.nc_matmul(nl.load(q_t), nl.load(k_t))  # [n, m] in PSUM
        acc = nl.zeros((n, v.shape[1]), nl.float32, buffer=nl.psum)
        for c in blocks:
            probs_t = nisa.nc_transpose(scores[:, c * 64 : (c + 1) * 64])  # [64, n]
            acc += nisa.nc_matmul(nl.copy(probs_t), nl.load(v[c * 64 : (c + 1) * 64, :]))
        bias = nl.ndarray((n, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=bias, value=0.25)
        nl.store(out, value=nl.add(acc, bias))
        return out

    # sizes keep every product at most row_lowering.MATMUL_FLOPS (2*64*128*64 = 2^20)
    q_t, v = _x(64, 64, special=False), _x(128, 96 if order == "descending" else 64, special=False)
    k_t = _x(64, 128, special=False)
    if moving_layout == "columns":  # both column-major: contiguous along the contraction
        q_t, k_t = np.asfortranarray(q_t), np.asfortranarray(k_t)
    expected, got, program = _run(kernel, q_t, k_t, v)
    assert program.row_programs >= 1
    assert "torch.mm" not in program.source and "np." not in program.source
    # contraction loops: q^T k, then two P@V products, or one when fused
    assert sources[-1].count("for (long k = 0; k <") == (2 if order == "ascending" else 3)
    # |scores| ~ 3*3*8 = 72 over 64 terms, then 128-term products: float32 reordering
    _close(got, expected, rtol=1e-4, atol=1e-2)
    _close(got, (q_t.T @ k_t) @ v + 0.25, rtol=1e-4, atol=1e-2)
