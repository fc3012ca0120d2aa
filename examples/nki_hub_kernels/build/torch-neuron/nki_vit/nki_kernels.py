"""The NKI kernels of this repository (new-style ``nki`` imports, legacy tile-returning
calls; both run on the NeuronCore and on TorchNeuron's simulator)."""

import nki
import nki.isa as nisa
import nki.language as nl
from torch import Tensor


@nki.jit
def rmsnorm_kernel(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """y = x / sqrt(mean(x^2, -1) + eps) * weight over the rows of x [n, d] (float32 math)."""
    n, d = x.shape
    out = nl.ndarray((n, d), dtype=x.dtype, buffer=nl.shared_hbm)
    w = nl.load(weight.reshape((1, d)))
    for t in nl.static_range((n + 127) // 128):
        rows = min(128, n - t * 128)
        tile = nl.load(x[t * 128 : t * 128 + rows, :], dtype=nl.float32)
        squares = nl.ndarray((rows, d), dtype=nl.float32)
        total = nl.ndarray((rows, 1), dtype=nl.float32)
        nisa.activation(dst=squares, op=nl.square, data=tile, reduce_op=nl.add, reduce_res=total)
        inv = nl.rsqrt(nl.add(nl.multiply(total, 1.0 / d), eps))
        normed = nl.multiply(tile, inv)
        scaled = nl.multiply(normed, nl.broadcast_to(w, shape=(rows, d)), dtype=x.dtype)
        nl.store(out[t * 128 : t * 128 + rows, :], value=scaled)
    return out


@nki.jit
def vit_attention_kernel(q_t: Tensor, k_t: Tensor, v: Tensor, scale: float) -> Tensor:
    """softmax(q k^T * scale) v for every (batch, head), fused: scores stay in PSUM/SBUF.

    q_t, k_t: [batch, heads, head_dim, seq] (queries and keys transposed, so the head
    dimension is the contraction/partition axis); v: [batch, heads, seq, head_dim].
    Returns [batch, seq, heads, head_dim] (the layout the output projection reads).
    seq <= 512 (one PSUM bank of scores per query tile), head_dim <= 128."""
    batch, heads, d, seq = q_t.shape
    out = nl.ndarray((batch, seq, heads, d), dtype=v.dtype, buffer=nl.shared_hbm)
    for b in nl.static_range(batch):
        for h in nl.static_range(heads):
            k_tile = nl.load(k_t[b, h])  # [d, seq]
            for i in nl.static_range((seq + 127) // 128):
                rows = min(128, seq - i * 128)
                q_tile = nl.load(q_t[b, h, :, i * 128 : i * 128 + rows])  # [d, rows]
                scores = nisa.nc_matmul(q_tile, k_tile)  # PSUM [rows, seq]
                row_max = nisa.tensor_reduce(nl.max, scores, axis=[1], keepdims=True)
                neg_max = nl.multiply(row_max, -scale)
                row_sum = nl.ndarray((rows, 1), dtype=nl.float32)
                probs = nisa.activation(
                    op=nl.exp,
                    data=scores,
                    scale=scale,
                    bias=neg_max,
                    reduce_op=nl.add,
                    reduce_res=row_sum,
                )
                pv = nl.zeros((rows, d), nl.float32, buffer=nl.psum)
                for c in nl.static_range((seq + 127) // 128):
                    cols = min(128, seq - c * 128)
                    probs_t = nisa.nc_transpose(probs[:, c * 128 : c * 128 + cols])
                    probs_t_sb = nl.copy(probs_t, dtype=v.dtype)
                    v_tile = nl.load(v[b, h, c * 128 : c * 128 + cols, :])  # [cols, d]
                    pv += nisa.nc_matmul(probs_t_sb, v_tile)
                result = nl.divide(pv, row_sum, dtype=v.dtype)
                nl.store(out[b, i * 128 : i * 128 + rows, h, :], value=result)
    return out
