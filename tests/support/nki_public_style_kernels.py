"""Kernels written exactly in the style of AWS's public NKI tutorials (aws-neuron/nki-samples:
tensor addition, RMSNorm, matrix multiplication, transpose2d, average pooling), with the
tutorials' own import lines: this file imports ``neuronxcc.nki`` and ``nki``, not
``torchneuron``. It is our code (the tutorials' subjects and idioms, not their text) and runs
only after ``torchneuron.nki.install_aliases()`` (tests/test_nki_public_style.py)."""
# ruff: noqa: N803, N806  (the tutorials' naming: lhsT, TILE_M, ...)

import neuronxcc.nki as nki
import neuronxcc.nki.language as nl
import nki as nki_new
import nki.isa as nisa
import nki.language as nl_new
from neuronxcc.nki.typing import tensor


# -- tensor addition: SPMD grid, affine indices, tile operator ------------------------------
@nki.jit
def tensor_add_kernel_(a_input, b_input):
    c_output = nl.ndarray(a_input.shape, dtype=a_input.dtype, buffer=nl.shared_hbm)
    row0 = nl.program_id(0) * 128
    col0 = nl.program_id(1) * 512
    ix = row0 + nl.arange(128)[:, None]
    iy = col0 + nl.arange(512)[None, :]
    a_tile = nl.load(a_input[ix, iy])
    b_tile = nl.load(b_input[ix, iy])
    c_tile = a_tile + b_tile
    nl.store(c_output[ix, iy], value=c_tile)
    return c_output


def tensor_add(a_input, b_input):
    grid_x = a_input.shape[0] // 128
    grid_y = a_input.shape[1] // 512
    return tensor_add_kernel_[grid_x, grid_y](a_input, b_input)


# -- RMSNorm: masked row tiles, weight broadcast with the tile method -----------------------
@nki.jit
def rmsnorm_kernel_(a_tensor, g_tensor):
    out_tensor = nl.ndarray(a_tensor.shape, dtype=a_tensor.dtype, buffer=nl.hbm)
    num_rows, num_cols = a_tensor.shape
    ix = nl.arange(128)[:, None]
    iw = nl.arange(1)[:, None]
    iy = nl.arange(num_cols)[None, :]
    g_tile = nl.load(g_tensor.reshape((1, num_cols))[iw, iy])
    for i in nl.affine_range((num_rows + 127) // 128):
        a_tile = nl.load(a_tensor[i * 128 + ix, iy], mask=(i * 128 + ix < num_rows))
        in_square = nl.square(a_tile)
        square_sum = nl.sum(in_square, axis=[1])
        mean = square_sum / num_cols
        rms_reciprocal = nl.rsqrt(mean)
        out_tile = nl.multiply(a_tile, rms_reciprocal)
        g_bcast = g_tile.broadcast_to((128, num_cols))
        out_tile[...] = nl.multiply(out_tile, g_bcast, mask=(i * 128 + ix < num_rows))
        nl.store(out_tensor[i * 128 + ix, iy], value=out_tile, mask=(i * 128 + ix < num_rows))
    return out_tensor


# -- transpose2d: affine index expressions on both sides of an assignment --------------------
@nki.jit
def transpose2d_kernel_(in_tensor, shape2D):
    out_tensor = nl.ndarray(in_tensor.shape, dtype=in_tensor.dtype, buffer=nl.shared_hbm)
    sz_p, _ = in_tensor.shape
    in_tile = nl.load(in_tensor)
    sz_f1, sz_f2 = shape2D
    i_p0 = nl.arange(sz_p)[:, None, None]
    i_f1 = nl.arange(sz_f1)[None, :, None]
    i_f2 = nl.arange(sz_f2)[None, None, :]
    out_tile = nl.ndarray(shape=(sz_p, sz_f2 * sz_f1), dtype=out_tensor.dtype)
    out_tile[i_p0, i_f2 * sz_f1 + i_f1] = nl.copy(in_tile[i_p0, i_f1 * sz_f2 + i_f2])
    nl.store(out_tensor, value=out_tile)
    return out_tensor


# -- average pooling: mgrid, typed annotations, sum over two free axes -----------------------
@nki.jit
def avgpool_kernel_(in_tensor, pool_size):
    sz_cin, sz_hin, sz_win = in_tensor.shape
    sz_hout, sz_wout = sz_hin // pool_size, sz_win // pool_size
    out_tensor = nl.ndarray((sz_cin, sz_hout, sz_wout), dtype=in_tensor.dtype, buffer=nl.shared_hbm)
    i0, i1, i2, i3, i4 = nl.mgrid[
        0:sz_cin, 0 : sz_hin // pool_size, 0:pool_size, 0 : sz_win // pool_size, 0:pool_size
    ]
    in_tile: tensor[sz_cin, sz_hin, sz_win] = nl.load(in_tensor)
    out_tile: tensor[sz_cin, sz_hout, sz_wout] = nl.sum(
        in_tile[i0, pool_size * i1 + i2, pool_size * i3 + i4], axis=[2, 4]
    ) / (pool_size * pool_size)
    nl.store(out_tensor, value=out_tile)
    return out_tensor


# -- matrix multiplication, new API: basic, tiled, hoisted loads, SBUF accumulation ----------
@nki_new.jit
def matmul_basic_(lhsT, rhs):
    K, M = lhsT.shape
    _, N = rhs.shape
    result = nl_new.ndarray((M, N), dtype=lhsT.dtype, buffer=nl_new.shared_hbm)
    lhs_tile = nl_new.ndarray(lhsT.shape, dtype=lhsT.dtype, buffer=nl_new.sbuf)
    rhs_tile = nl_new.ndarray(rhs.shape, dtype=rhs.dtype, buffer=nl_new.sbuf)
    nisa.dma_copy(dst=lhs_tile, src=lhsT)
    nisa.dma_copy(dst=rhs_tile, src=rhs)
    result_psum = nl_new.ndarray(result.shape, dtype=nl_new.float32, buffer=nl_new.psum)
    nisa.nc_matmul(result_psum, lhs_tile, rhs_tile)
    result_sbuf = nl_new.ndarray(result_psum.shape, dtype=result.dtype, buffer=nl_new.sbuf)
    nisa.tensor_copy(dst=result_sbuf, src=result_psum, dtype=result.dtype)
    nisa.dma_copy(dst=result, src=result_sbuf)
    return result


@nki_new.jit
def matmul_tiled_(lhsT, rhs):
    K, M = lhsT.shape
    _, N = rhs.shape
    TILE_M = nl_new.tile_size.gemm_stationary_fmax
    TILE_K = nl_new.tile_size.pmax
    TILE_N = nl_new.tile_size.gemm_moving_fmax
    result = nl_new.ndarray((M, N), dtype=lhsT.dtype, buffer=nl_new.shared_hbm)
    for m in nl_new.affine_range(M // TILE_M):
        for n in nl_new.affine_range(N // TILE_N):
            res_psum = nl_new.ndarray((TILE_M, TILE_N), nl_new.float32, buffer=nl_new.psum)
            for k in nl_new.affine_range(K // TILE_K):
                lhsT_tile = nl_new.ndarray((TILE_K, TILE_M), dtype=lhsT.dtype, buffer=nl_new.sbuf)
                rhs_tile = nl_new.ndarray((TILE_K, TILE_N), dtype=rhs.dtype, buffer=nl_new.sbuf)
                nisa.dma_copy(
                    dst=lhsT_tile,
                    src=lhsT[k * TILE_K : (k + 1) * TILE_K, m * TILE_M : (m + 1) * TILE_M],
                )
                nisa.dma_copy(
                    dst=rhs_tile,
                    src=rhs[k * TILE_K : (k + 1) * TILE_K, n * TILE_N : (n + 1) * TILE_N],
                )
                nisa.nc_matmul(dst=res_psum, stationary=lhsT_tile, moving=rhs_tile)
            res_sb = nl_new.ndarray(res_psum.shape, dtype=result.dtype, buffer=nl_new.sbuf)
            nisa.tensor_copy(dst=res_sb, src=res_psum, dtype=result.dtype)
            nisa.dma_copy(
                dst=result[m * TILE_M : (m + 1) * TILE_M, n * TILE_N : (n + 1) * TILE_N], src=res_sb
            )
    return result


@nki_new.jit
def matmul_hoisted_sbuf_accumulate_(lhsT, rhs):
    """Loads hoisted out of the inner loop into lists of tiles; partial products added into
    memset SBUF tiles with tensor_tensor; results packed into one row-block store."""
    K, M = lhsT.shape
    _, N = rhs.shape
    TILE_M, TILE_K, TILE_N = 128, 128, 512
    result = nl_new.ndarray((M, N), dtype=lhsT.dtype, buffer=nl_new.shared_hbm)
    for m in nl_new.affine_range(M // TILE_M):
        lhsT_tiles = []
        for k in nl_new.affine_range(K // TILE_K):
            lhsT_tile = nl_new.ndarray(shape=(TILE_K, TILE_M), dtype=lhsT.dtype, buffer=nl_new.sbuf)
            nisa.dma_copy(
                dst=lhsT_tile,
                src=lhsT[k * TILE_K : (k + 1) * TILE_K, m * TILE_M : (m + 1) * TILE_M],
            )
            lhsT_tiles.append(lhsT_tile)
        packed = nl_new.ndarray(shape=(TILE_M, N), dtype=nl_new.float32, buffer=nl_new.sbuf)
        for n in nl_new.affine_range(N // TILE_N):
            total = nl_new.ndarray(shape=(TILE_M, TILE_N), dtype=nl_new.float32, buffer=nl_new.sbuf)
            nisa.memset(dst=total, value=0.0)
            for k in nl_new.affine_range(K // TILE_K):
                rhs_tile = nl_new.ndarray(
                    shape=(TILE_K, TILE_N), dtype=rhs.dtype, buffer=nl_new.sbuf
                )
                nisa.dma_copy(
                    dst=rhs_tile[0:TILE_K, 0:TILE_N],
                    src=rhs[k * TILE_K : (k + 1) * TILE_K, n * TILE_N : (n + 1) * TILE_N],
                )
                part = nl_new.ndarray(
                    shape=(TILE_M, TILE_N), dtype=nl_new.float32, buffer=nl_new.psum
                )
                nisa.nc_matmul(
                    dst=part, stationary=lhsT_tiles[k], moving=rhs_tile, accumulate=False
                )
                nisa.tensor_tensor(dst=total, data1=total, data2=part, op=nl_new.add)
            nisa.tensor_copy(dst=packed[0:TILE_M, n * TILE_N : (n + 1) * TILE_N], src=total)
        nisa.dma_copy(dst=result[m * TILE_M : (m + 1) * TILE_M, 0:N], src=packed)
    return result
