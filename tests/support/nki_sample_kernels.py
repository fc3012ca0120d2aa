"""Sample-style NKI kernels for the tests and the benchmark, written for this project from
AWS's public NKI documentation (the tutorials' subjects, our own code). Each kernel uses
only the import lines of the API generation it is written in; `legacy` ones use the
``neuronxcc.nki`` style (tiles returned by nl.load / nisa calls), `new` ones the ``nki``
style (destination-first nisa calls)."""

from __future__ import annotations

import numpy as np

import torchneuron.nki as nki
import torchneuron.nki.isa as nisa
import torchneuron.nki.language as nl


# -- tensor addition (legacy, SPMD grid of 128x512 tiles) -----------------------------------
@nki.jit
def add_kernel(a, b):
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    rows = nl.program_id(0) * 128 + nl.arange(128)[:, None]
    cols = nl.program_id(1) * 512 + nl.arange(512)[None, :]
    left = nl.load(a[rows, cols])
    right = nl.load(b[rows, cols])
    nl.store(out[rows, cols], value=left + right)
    return out


def tensor_add(a, b):
    return add_kernel[a.shape[0] // 128, a.shape[1] // 512](a, b)


# -- RMSNorm (legacy; rows not a multiple of 128 are masked) --------------------------------
@nki.jit
def rmsnorm_kernel(x, weight, eps):
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    i_f = nl.arange(d)[None, :]
    w = nl.load(weight.reshape((1, d))[nl.arange(1)[:, None], i_f])
    w_rows = nl.broadcast_to(w, shape=(128, d))
    for t in nl.affine_range((n + 127) // 128):
        i_p = t * 128 + nl.arange(128)[:, None]
        tile = nl.load(x[i_p, i_f], mask=(i_p < n))
        mean_sq = nl.mean(nl.square(tile), axis=[1])
        scale = nl.rsqrt(mean_sq + eps)
        normed = nl.multiply(tile, scale)
        nl.store(out[i_p, i_f], value=nl.multiply(normed, w_rows), mask=(i_p < n))
    return out


def rmsnorm_ref(x, weight, eps):
    x32 = x.astype(np.float32)
    return x32 / np.sqrt((x32 * x32).mean(-1, keepdims=True) + eps) * weight


# -- RMSNorm (new style: activation with a fused reduction, tensor_scalar) -------------------
@nki.jit
def rmsnorm_new_kernel(x, weight, eps):
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    w = nl.ndarray((128, d), dtype=weight.dtype, buffer=nl.sbuf)
    for p in nl.static_range(128):
        nisa.dma_copy(dst=w[p : p + 1, :], src=weight.reshape((1, d)))
    for t in nl.affine_range(n // 128):
        tile = nl.ndarray((128, d), dtype=x.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=tile, src=x[t * 128 : (t + 1) * 128, :])
        squares = nl.ndarray((128, d), dtype=nl.float32, buffer=nl.sbuf)
        total = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.activation(dst=squares, op=nl.square, data=tile, reduce_op=nl.add, reduce_res=total)
        inv = nl.ndarray((128, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(inv, total, nl.multiply, 1.0 / d, op1=nl.add, operand1=eps)
        nisa.activation(dst=inv, op=nl.rsqrt, data=inv)
        normed = nl.ndarray((128, d), dtype=nl.float32, buffer=nl.sbuf)
        nisa.tensor_scalar(normed, tile, nl.multiply, inv)
        result = nl.ndarray((128, d), dtype=x.dtype, buffer=nl.sbuf)
        nisa.tensor_tensor(dst=result, data1=normed, data2=w, op=nl.multiply)
        nisa.dma_copy(dst=out[t * 128 : (t + 1) * 128, :], src=result)
    return out


# -- LayerNorm (new style: bn_stats / bn_aggr, activation with per-partition bias/scale) ----
@nki.jit
def layernorm_kernel(x, gamma, beta, eps):
    n, d = x.shape
    chunk = nl.tile_size.bn_stats_fmax
    chunks = (d + chunk - 1) // chunk
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    g = nl.load(gamma.reshape((1, d)))
    b = nl.load(beta.reshape((1, d)))
    g_rows = nl.broadcast_to(g, shape=(128, d))
    b_rows = nl.broadcast_to(b, shape=(128, d))
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
        rstd = nl.rsqrt(mean_var[:, 1:2] + eps)
        shift = nl.multiply(nl.negative(mean_var[:, 0:1]), rstd)
        normed = nisa.activation(op=nl.copy, data=tile, scale=rstd, bias=shift)
        result = nl.add(nl.multiply(normed, g_rows), b_rows, dtype=x.dtype)
        nl.store(out[t * 128 : (t + 1) * 128, :], value=result)
    return out


def layernorm_ref(x, gamma, beta, eps):
    x32 = x.astype(np.float32)
    mean = x32.mean(-1, keepdims=True)
    var = x32.var(-1, keepdims=True)
    return (x32 - mean) / np.sqrt(var + eps) * gamma + beta


# -- softmax over rows (legacy) --------------------------------------------------------------
@nki.jit
def softmax_kernel(x):
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    for t in nl.affine_range(n // 128):
        tile = nl.load(x[t * 128 : (t + 1) * 128, :])
        row_max = nl.max(tile, axis=[1])
        shifted = nl.exp(nl.subtract(tile, row_max))
        total = nl.sum(shifted, axis=[1])
        nl.store(out[t * 128 : (t + 1) * 128, :], value=nl.divide(shifted, total))
    return out


def softmax_ref(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# -- transpose of flattened 2-D matrices along the free axis (legacy, affine indices) --------
@nki.jit
def transpose2d_kernel(x, rows, cols):
    parts = x.shape[0]
    out = nl.ndarray(x.shape, dtype=x.dtype, buffer=nl.shared_hbm)
    tile = nl.load(x)
    i_p = nl.arange(parts)[:, None, None]
    i_r = nl.arange(rows)[None, :, None]
    i_c = nl.arange(cols)[None, None, :]
    swapped = nl.ndarray((parts, rows * cols), dtype=x.dtype, buffer=nl.sbuf)
    swapped[i_p, i_c * rows + i_r] = nl.copy(tile[i_p, i_r * cols + i_c])
    nl.store(out, value=swapped)
    return out


def transpose2d_ref(x, rows, cols):
    return x.reshape(x.shape[0], rows, cols).transpose(0, 2, 1).reshape(x.shape[0], rows * cols)


# -- 2-D average pooling (legacy, mgrid 5-D window indexing) ---------------------------------
@nki.jit
def avgpool_kernel(x, pool):
    channels, height, width = x.shape
    out = nl.ndarray((channels, height // pool, width // pool), dtype=x.dtype, buffer=nl.shared_hbm)
    for c in nl.affine_range((channels + 127) // 128):
        i_c, i_h, i_ph, i_w, i_pw = nl.mgrid[
            0:128, 0 : height // pool, 0:pool, 0 : width // pool, 0:pool
        ]
        chan = c * 128 + i_c
        tile = nl.load(x[chan, i_h * pool + i_ph, i_w * pool + i_pw], mask=(chan < channels))
        pooled = nl.sum(tile, axis=[2, 4]) / (pool * pool)
        o_c, o_h, o_w = nl.mgrid[0:128, 0 : height // pool, 0 : width // pool]
        nl.store(out[c * 128 + o_c, o_h, o_w], value=pooled, mask=(c * 128 + o_c < channels))
    return out


def avgpool_ref(x, pool):
    c, h, w = x.shape
    return x.reshape(c, h // pool, pool, w // pool, pool).mean(axis=(2, 4))


# -- tiled matmul: new style (dma_copy, nc_matmul into PSUM, tensor_copy out) ----------------
@nki.jit
def matmul_new_kernel(lhs_t, rhs):
    k_dim, m_dim = lhs_t.shape
    _, n_dim = rhs.shape
    tm, tk, tn = nl.tile_size.gemm_stationary_fmax, nl.tile_size.pmax, nl.tile_size.gemm_moving_fmax
    out = nl.ndarray((m_dim, n_dim), dtype=lhs_t.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(m_dim // tm):
        for n in nl.affine_range(n_dim // tn):
            acc = nl.ndarray((tm, tn), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(k_dim // tk):
                a = nl.ndarray((tk, tm), dtype=lhs_t.dtype, buffer=nl.sbuf)
                b = nl.ndarray((tk, tn), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=a, src=lhs_t[k * tk : (k + 1) * tk, m * tm : (m + 1) * tm])
                nisa.dma_copy(dst=b, src=rhs[k * tk : (k + 1) * tk, n * tn : (n + 1) * tn])
                nisa.nc_matmul(dst=acc, stationary=a, moving=b)
            result = nl.ndarray((tm, tn), dtype=out.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=result, src=acc)
            nisa.dma_copy(dst=out[m * tm : (m + 1) * tm, n * tn : (n + 1) * tn], src=result)
    return out


# -- tiled matmul: legacy style (nl.load, nl.matmul(transpose_x=True), PSUM +=) --------------
@nki.jit
def matmul_legacy_kernel(lhs_t, rhs):
    k_dim, m_dim = lhs_t.shape
    _, n_dim = rhs.shape
    out = nl.ndarray((m_dim, n_dim), dtype=lhs_t.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(m_dim // 128):
        for n in nl.affine_range(n_dim // 512):
            acc = nl.zeros((128, 512), nl.float32, buffer=nl.psum)
            for k in nl.affine_range(k_dim // 128):
                a = nl.load(lhs_t[k * 128 : (k + 1) * 128, m * 128 : (m + 1) * 128])
                b = nl.load(rhs[k * 128 : (k + 1) * 128, n * 512 : (n + 1) * 512])
                acc += nl.matmul(a, b, transpose_x=True)
            nl.store(
                out[m * 128 : (m + 1) * 128, n * 512 : (n + 1) * 512],
                value=nl.copy(acc, dtype=out.dtype),
            )
    return out


# -- flash attention forward (one head; q/k given transposed [d, S]; online softmax) ---------
@nki.jit
def flash_attention_kernel(q_t, k_t, v, scale):
    d, seq_q = q_t.shape
    _, seq_k = k_t.shape
    block_k = 512
    out = nl.ndarray((seq_q, d), dtype=v.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(seq_q // 128):
        q_tile = nl.load(q_t[:, i * 128 : (i + 1) * 128])
        running_max = nl.full((128, 1), -1e30, nl.float32)
        running_sum = nl.zeros((128, 1), nl.float32)
        acc = nl.zeros((128, d), nl.float32)
        for j in nl.sequential_range(seq_k // block_k):
            k_tile = nl.load(k_t[:, j * block_k : (j + 1) * block_k])
            scores = nisa.nc_matmul(q_tile, k_tile)  # [128 q, 512 k] in PSUM
            block_max = nisa.tensor_reduce(nl.max, scores, axis=[1], keepdims=True)
            new_max = nl.maximum(running_max, nl.multiply(block_max, scale))
            neg_max = nl.negative(new_max)
            block_sum = nl.ndarray((128, 1), dtype=nl.float32)
            probs = nisa.activation(
                op=nl.exp,
                data=scores,
                scale=scale,
                bias=neg_max,
                reduce_op=nl.add,
                reduce_res=block_sum,
            )
            correction = nl.exp(nl.subtract(running_max, new_max))
            running_sum = nl.add(nl.multiply(running_sum, correction), block_sum)
            pv = nl.zeros((128, d), nl.float32, buffer=nl.psum)
            for c in nl.affine_range(block_k // 128):
                probs_t = nisa.nc_transpose(probs[:, c * 128 : (c + 1) * 128])
                probs_t_sb = nl.copy(probs_t, dtype=v.dtype)
                v_tile = nl.load(v[j * block_k + c * 128 : j * block_k + (c + 1) * 128, :])
                pv += nisa.nc_matmul(probs_t_sb, v_tile)
            acc = nl.add(nl.multiply(acc, correction), pv)
            running_max = new_max
        nl.store(out[i * 128 : (i + 1) * 128, :], value=nl.divide(acc, running_sum, dtype=v.dtype))
    return out


def attention_ref(q, k, v, scale):
    s = (q.astype(np.float64) @ k.T.astype(np.float64)) * scale
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v
