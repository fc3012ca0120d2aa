"""Sample-style NKI kernels (tests/support/nki_sample_kernels.py) against numpy references, on the
interpreter and the compiled path. The compiled path's numpy program
(TORCHNEURON_NKI_ROW_PROGRAMS=never) equals the interpreter exactly, except where it fuses a
matmul contraction chain into one matmul (torchneuron/nki/fusion.py): the summation order then
changes, and results agree to float32 rounding of a K-term sum. By default, runs of row-wise
instructions become C++ row programs (torchneuron/nki/row_programs.py), which reassociate
sums and use a polynomial exp: results agree to float32 rounding."""

from __future__ import annotations

import numpy as np
import pytest
import support.nki_sample_kernels as k

RNG = np.random.default_rng(1234)


def _f32(*shape):
    return RNG.standard_normal(shape, dtype=np.float32)


X_ROWS = _f32(300, 256)  # 300 rows: the last row tile is masked
X_WIDE = _f32(256, 1000)  # 1000 columns: bn_stats in chunks of 512 + 488
W256 = _f32(256)
G1000, B1000 = _f32(1000), _f32(1000)
LHS_T, RHS = _f32(256, 256), _f32(256, 1024)
Q, KEYS, VALUES = _f32(256, 64), _f32(1024, 64), _f32(1024, 64)

# (name, kernel launch, args, reference, absolute tolerance)
CASES = [
    ("tensor_add", k.add_kernel[2, 2], (_f32(256, 1024), _f32(256, 1024)), lambda a, b: a + b, 0.0),
    ("rmsnorm_legacy", k.rmsnorm_kernel, (X_ROWS, W256, 1e-6), k.rmsnorm_ref, 1e-5),
    ("rmsnorm_new", k.rmsnorm_new_kernel, (X_ROWS[:256], W256, 1e-6), k.rmsnorm_ref, 1e-5),
    ("layernorm_new", k.layernorm_kernel, (X_WIDE, G1000, B1000, 1e-5), k.layernorm_ref, 1e-4),
    ("softmax_legacy", k.softmax_kernel, (X_WIDE,), k.softmax_ref, 1e-6),
    ("transpose2d_legacy", k.transpose2d_kernel, (_f32(5, 12), 3, 4), k.transpose2d_ref, 0.0),
    ("avgpool_legacy", k.avgpool_kernel, (_f32(130, 8, 12), 2), k.avgpool_ref, 1e-6),
    ("matmul_new", k.matmul_new_kernel, (LHS_T, RHS), lambda a, b: a.T @ b, 1e-3),
    ("matmul_legacy", k.matmul_legacy_kernel, (LHS_T, RHS), lambda a, b: a.T @ b, 1e-3),
    (
        "flash_attention",
        k.flash_attention_kernel,
        (Q.T.copy(), KEYS.T.copy(), VALUES, 0.125),
        lambda qt, kt, v, s: k.attention_ref(qt.T, kt.T, v, s),
        1e-4,
    ),
]


# Kernels whose PSUM accumulation chains the compiled path fuses into one matmul each, and
# whose 2x2 grid of output blocks then merges into one matmul: the whole kernel is one GEMM.
FUSED_CHAINS = {"matmul_new", "matmul_legacy"}
# Kernels without a run of row-wise instructions over >= 65536 elements at these sizes (every
# other kernel has one, which by default is a C++ row program).
NUMPY_ONLY = {"transpose2d_legacy", "avgpool_legacy", *FUSED_CHAINS}
# Kernels with a chain fused over transposed tiles (flash attention's P@V over nc_transpose'd
# probabilities): reassociated sums, so equal to the interpreter to float32 rounding.
TRANSPOSED_CHAINS = {"flash_attention"}


@pytest.fixture(params=["never", "auto"], ids=["numpy-program", "default"])
def row_program_mode(request, monkeypatch):
    monkeypatch.setenv("TORCHNEURON_NKI_ROW_PROGRAMS", request.param)
    return request.param


@pytest.mark.parametrize("name,kernel,args,reference,atol", CASES, ids=[c[0] for c in CASES])
def test_kernel_matches_reference_and_compiled_equals_interpreter(
    name, kernel, args, reference, atol, row_program_mode
):
    expected = reference(*args)
    interpreted = kernel.interpret(*args)
    np.testing.assert_allclose(interpreted, expected, rtol=1e-5, atol=atol)
    first = kernel(*args)  # traces (the interpreter) and compiles
    second = kernel(*args)  # runs the compiled code
    assert len(kernel._cache) >= 1
    program = kernel._cache[max(kernel._cache, key=lambda key: key[-1] == row_program_mode)]
    lowered = program.program.row_programs
    assert (lowered > 0) == (row_program_mode == "auto" and name not in NUMPY_ONLY), lowered
    if lowered and name not in FUSED_CHAINS:
        # reassociated float32 sums of <= 1000 terms and a polynomial exp (<= 2 ulp)
        np.testing.assert_allclose(first, interpreted, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(second, interpreted, rtol=1e-5, atol=1e-6)
        return
    if name in FUSED_CHAINS:
        source = next(iter(kernel._cache.values())).program.source
        assert source.splitlines()[1:] == [  # 2x2 output tiles, K folded: one matmul
            "    torch.mm(_t(a0[K2]).T, _t(a1[K3]), out=_t(o0[K4]))"
        ], source
        # |a.T @ b| entries here are ~sqrt(K)=16; a K=256 float32 sum reordered differs by
        # at most a few ulps of the partial sums: 1e-5 relative, 1e-4 absolute.
        np.testing.assert_allclose(first, interpreted, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(second, interpreted, rtol=1e-5, atol=1e-4)
        return
    if name in TRANSPOSED_CHAINS:
        source = next(iter(kernel._cache.values())).program.source
        assert ".add_(" not in source, source  # every P@V chain is one matmul
        # outputs ~0.1 from probabilities summing to 1 over K = 512 keys: float32 rounding of
        # the reordered sums is below 1e-6 absolute
        np.testing.assert_allclose(first, interpreted, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(second, interpreted, rtol=1e-5, atol=1e-6)
        return
    np.testing.assert_array_equal(first, interpreted)
    np.testing.assert_array_equal(second, interpreted)


def test_compiled_path_is_cached_per_signature():
    kernel = k.softmax_kernel
    kernel._cache.clear()
    kernel(_f32(128, 64))
    kernel(_f32(128, 64))
    assert len(kernel._cache) == 1
    kernel(_f32(256, 64))
    assert len(kernel._cache) == 2


def test_compiled_kernel_reuses_scratch_between_tile_lifetimes():
    kernel = k.matmul_new_kernel
    kernel(LHS_T, RHS)
    entry = next(iter(kernel._cache.values()))
    # 2x2 output tiles x 2 k-steps allocate 20 on-chip tiles; live at once: a few.
    assert entry.program.slots <= 6, entry.program.source


def test_psum_accumulates_in_float32_from_bfloat16_storage():
    import torch

    a = torch.randn(128, 128, dtype=torch.bfloat16)
    b = torch.randn(128, 512, dtype=torch.bfloat16)
    got = k.matmul_new_kernel(a, b)
    assert got.dtype == torch.bfloat16
    expected = (a.float().T @ b.float()).to(torch.bfloat16)
    torch.testing.assert_close(got, expected, rtol=1.6e-2, atol=1e-2)


def test_psum_accumulate_folding_is_exact_and_unfusable_chains_stay_per_block(monkeypatch):
    monkeypatch.setenv("TORCHNEURON_NKI_ROW_PROGRAMS", "never")  # the numpy program, exact
    from torchneuron import nki
    from torchneuron.nki import isa as nisa
    from torchneuron.nki import language as nl

    @nki.jit
    def computed_operands(lhs_t, rhs):
        # the stationary operands are computed tiles (neither loads nor transposes), so the
        # chain is not fused; its `acc += nc_matmul(...)` pairs fold into accumulating
        # matmuls: the same float32 product and add, bit-identical to the interpreter
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
        for blk in nl.affine_range(2):
            a = nl.multiply(nl.load(lhs_t[blk * 128 : (blk + 1) * 128, :]), 1.5)
            b = nl.load(rhs[blk * 128 : (blk + 1) * 128, :])
            acc += nisa.nc_matmul(a, b)
        nl.store(out, value=nl.copy(acc))
        return out

    args = (_f32(256, 128), _f32(256, 512))
    interpreted = computed_operands.interpret(*args)
    np.testing.assert_allclose(interpreted, 1.5 * args[0].T @ args[1], rtol=1e-5, atol=1e-4)
    computed_operands(*args)
    source = next(iter(computed_operands._cache.values())).program.source
    assert source.count("torch.mm") == 2 and ".add_(" in source, source
    np.testing.assert_array_equal(computed_operands(*args), interpreted)


def test_chain_is_not_fused_when_the_kernel_overwrites_its_operand_in_between():
    from torchneuron import nki
    from torchneuron.nki import isa as nisa
    from torchneuron.nki import language as nl

    @nki.jit
    def overwrite_between(lhs_t, rhs):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
        for blk in nl.sequential_range(2):
            a = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
            b = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=a, src=lhs_t[blk * 128 : (blk + 1) * 128, :])
            nisa.dma_copy(dst=b, src=rhs[blk * 128 : (blk + 1) * 128, :])
            nisa.nc_matmul(dst=acc, stationary=a, moving=b)
            # zero the row block of rhs just read: a matmul fused over the chain, reading
            # rhs after its last step, would see the zeros
            zeros = nl.zeros((128, 512), nl.float32)
            nl.store(rhs[blk * 128 : (blk + 1) * 128, :], value=zeros)
        result = nl.copy(acc)
        nl.store(out, value=result)
        return out

    lhs_t, rhs = _f32(256, 128), _f32(256, 512)
    expected = lhs_t.T @ rhs  # each block was read before it was zeroed
    interpreted = overwrite_between.interpret(lhs_t, rhs.copy())
    np.testing.assert_allclose(interpreted, expected, rtol=1e-5, atol=1e-4)
    overwrite_between(lhs_t, rhs.copy())
    np.testing.assert_array_equal(overwrite_between(lhs_t, rhs.copy()), interpreted)


def test_output_blocks_of_different_contractions_are_not_merged_into_one_matmul():
    from torchneuron import nki
    from torchneuron.nki import isa as nisa
    from torchneuron.nki import language as nl

    @nki.jit
    def two_contractions(lhs_t, rhs):
        # row block 0 of the product over K's 3 row blocks, row block 1 over its first 2: two
        # fused chains writing a grid of blocks, which one matmul over K would get wrong
        out = nl.ndarray((256, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        for m in nl.static_range(2):
            acc = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
            for blk in nl.static_range(3 - m):
                a = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
                b = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.sbuf)
                nisa.dma_copy(
                    dst=a, src=lhs_t[blk * 128 : (blk + 1) * 128, m * 128 : (m + 1) * 128]
                )
                nisa.dma_copy(dst=b, src=rhs[blk * 128 : (blk + 1) * 128, :])
                nisa.nc_matmul(dst=acc, stationary=a, moving=b)
            nl.store(out[m * 128 : (m + 1) * 128, :], value=nl.copy(acc))
        return out

    lhs_t, rhs = _f32(384, 256), _f32(384, 512)
    expected = np.concatenate([lhs_t[:, :128].T @ rhs, lhs_t[:256, 128:].T @ rhs[:256]])
    interpreted = two_contractions.interpret(lhs_t, rhs)
    np.testing.assert_allclose(interpreted, expected, rtol=1e-5, atol=1e-4)
    two_contractions(lhs_t, rhs)
    source = next(iter(two_contractions._cache.values())).program.source
    assert source.count("torch.mm") == 2, source  # one per row block
    np.testing.assert_allclose(two_contractions(lhs_t, rhs), interpreted, rtol=1e-5, atol=1e-4)


def test_bfloat16_psum_product_is_rounded_before_the_accumulate():
    from torchneuron import nki
    from torchneuron.nki import isa as nisa
    from torchneuron.nki import language as nl

    @nki.jit
    def bf16_product_then_add(lhs_t, rhs):
        out = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.shared_hbm)
        acc = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
        a = nl.load(lhs_t)
        b = nl.load(rhs)
        product = nl.ndarray((128, 512), dtype=nl.bfloat16, buffer=nl.psum)
        nisa.nc_matmul(dst=product, stationary=a, moving=b, accumulate=False)
        acc += product
        nl.store(out, value=nl.copy(acc))
        return out

    lhs_t, rhs = _f32(128, 128), _f32(128, 512)
    interpreted = bf16_product_then_add.interpret(lhs_t, rhs)
    bf16_product_then_add(lhs_t, rhs)
    np.testing.assert_array_equal(bf16_product_then_add(lhs_t, rhs), interpreted)


def test_fused_matmul_reads_negative_stride_and_read_only_inputs():
    # The compiled path's signature holds shapes and dtypes, not strides: a kernel compiled
    # for contiguous inputs is later called with reversed (negative-stride) and read-only
    # views, which the fused matmul reads straight from HBM.
    kernel = k.matmul_new_kernel
    lhs_t, rhs = _f32(256, 128), _f32(256, 512)
    kernel(lhs_t, rhs)
    reversed_lhs, reversed_rhs = lhs_t[::-1], rhs[::-1]
    frozen = rhs.copy()
    frozen.flags.writeable = False
    for a, b in ((reversed_lhs, reversed_rhs), (lhs_t, frozen)):
        np.testing.assert_allclose(kernel(a, b), a.T @ b, rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(kernel(a, b), kernel.interpret(a, b), rtol=1e-5, atol=1e-4)
