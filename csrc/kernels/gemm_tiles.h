// The GEMM/GEMV algorithm, written once over a vector type V and included by one source per
// instruction set (gemm.scalar.cpp-style plain source, gemm.avx2.cpp, gemm.avx512.cpp), each
// compiling it with its own flags. Everything here has internal linkage so the copies built
// for different instruction sets never meet at link time.
//
// Two paths:
//  - GEMV (m ≤ 8 and B's k index contiguous, i.e. the forward X·Wᵀ of decode; or n ≤ 8 and
//    A's k index contiguous, computed transposed): streams each weight row once, converting
//    bf16 to float32 in registers, with the m activation rows held in cache; memory-bound, so
//    the point is to read W exactly once at full bandwidth (gemv_rows.h).
//  - Packed GEMM (everything else): Goto-style blocking. An output tile of MC × NC rows and
//    columns (narrower when threads share the product: tile_shape) is one task; per KC
//    slice of k, A and B are read in place (float32 row-major), widened by rows (bf16
//    row-major A) or copied and converted to float32 into MR-row and NR-column panels, and
//    an MR × NR register-blocked FMA kernel accumulates in float32, in the output itself
//    (float32) or in a staging tile; scale and bias are applied and the result rounded to
//    the output dtype once (packed_tile).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "gemm.h"
#include "gemm_elements.h"
#include "gemv_rows.h"

namespace neuron::kernels {
namespace {

// MR × NV vectors of accumulators per register tile: NV = 2 in general, NV = 1 (with twice
// the rows) for products at most one vector wide, which two-vector panels would half waste.
template <class V, int MR, int NV = 2>
struct GemmTiles {
  static constexpr int W = V::kWidth;
  static constexpr int NR = NV * W;
  static constexpr int64_t KC = 256;
  static constexpr int64_t MC = MR * 32;
  static constexpr int64_t NC = NR * 16;

  // An output tile's rows and columns (tile_shape).
  struct TileShape {
    int64_t rows = MC, columns = NC;
    int64_t row_tiles(const GemmProblem& p) const { return (p.m + rows - 1) / rows; }
    int64_t column_tiles(const GemmProblem& p) const { return (p.n + columns - 1) / columns; }
  };

  struct Scratch {
    std::vector<float> a, b, c;
  };

  // Whether the register tile reads B in place (in whole NR-column panels): float32
  // row-major B, but not rows a multiple of 4 KB apart. Those all map to the same L1 sets
  // (64 sets of 64 B) and evict each other over KC rows: read in place at a 2048-float
  // stride, measured 54-66% of peak against 65-81% packed (AVX2 host); a 768-float stride
  // was no slower in place.
  static bool b_read_in_place(const GemmProblem& p) {
    return p.dtype == GemmDtype::kFloat32 && p.b.col_stride == 1 &&
           p.b.row_stride * int64_t{sizeof(float)} % 4096 != 0;
  }

  // A's rows [0, mc) × columns [0, kc) into MR-row panels, k-major within a panel.
  template <class E>
  static void pack_a(const E* a, int64_t rs, int64_t cs, int64_t mc, int64_t kc, float* dst) {
    for (int64_t r0 = 0; r0 < mc; r0 += MR) {
      const int64_t rows = std::min<int64_t>(MR, mc - r0);
      float* panel = dst + (r0 / MR) * kc * MR;
      if (cs == 1) {
        for (int64_t i = 0; i < rows; ++i) {
          const E* src = a + (r0 + i) * rs;
          for (int64_t k = 0; k < kc; ++k) panel[k * MR + i] = to_f32(src[k]);
        }
      } else {
        for (int64_t k = 0; k < kc; ++k) {
          const E* src = a + k * cs + r0 * rs;
          for (int64_t i = 0; i < rows; ++i) panel[k * MR + i] = to_f32(src[i * rs]);
        }
      }
      for (int64_t i = rows; i < MR; ++i) {
        for (int64_t k = 0; k < kc; ++k) panel[k * MR + i] = 0.0f;
      }
    }
  }

  // A's rows [0, rows) × columns [0, kc) (k contiguous) as float32 rows of stride kc.
  template <class E>
  static void widen_rows(const E* a, int64_t lda, int64_t rows, int64_t kc, float* dst) {
    for (int64_t i = 0; i < rows; ++i) {
      const E* src = a + i * lda;
      float* row = dst + i * kc;
      int64_t k = 0;
      for (; k + W <= kc; k += W) V::store(row + k, V::load(src + k));
      for (; k < kc; ++k) row[k] = to_f32(src[k]);
    }
  }

  // B's rows [0, kc) × columns [0, nc) into NR-column panels, k-major within a panel.
  template <class E>
  static void pack_b(const E* b, int64_t rs, int64_t cs, int64_t kc, int64_t nc, float* dst) {
    for (int64_t c0 = 0; c0 < nc; c0 += NR) {
      const int64_t cols = std::min<int64_t>(NR, nc - c0);
      float* panel = dst + (c0 / NR) * kc * NR;
      if (cs == 1) {
        for (int64_t k = 0; k < kc; ++k) {
          const E* src = b + k * rs + c0;
          float* row = panel + k * NR;
          for (int64_t j = 0; j < cols; ++j) row[j] = to_f32(src[j]);
          for (int64_t j = cols; j < NR; ++j) row[j] = 0.0f;
        }
      } else {
        for (int64_t j = 0; j < cols; ++j) {
          const E* src = b + (c0 + j) * cs;
          for (int64_t k = 0; k < kc; ++k) panel[k * NR + j] = to_f32(src[k * rs]);
        }
        for (int64_t j = cols; j < NR; ++j) {
          for (int64_t k = 0; k < kc; ++k) panel[k * NR + j] = 0.0f;
        }
      }
    }
  }

  // c[MR × NR] (+)= A rows · B columns over kc. A element (i, k) is at a[i·a_rs + k·a_ks]
  // (a packed panel: 1, MR; a row-major A read in place: lda, 1); B's NR columns at k
  // start at b + k·b_ks (packed: NR; a row-major B read in place: ldb).
  template <class EA, class EB>
  static void micro_kernel(const EA* a, int64_t a_rs, int64_t a_ks, const EB* b, int64_t b_ks,
                           int64_t kc, float* c, int64_t ldc, bool accumulate) {
    typename V::Reg acc[MR][NV];
    const EA* rows[MR];
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[i][v] = V::zero();
      rows[i] = a + i * a_rs;
    }
    for (int64_t k = 0; k < kc; ++k) {
      typename V::Reg bv[NV];
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) bv[v] = V::load(b + v * W);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const typename V::Reg av = V::set1(to_f32(*rows[i]));
        rows[i] += a_ks;
#pragma GCC unroll 2
        for (int v = 0; v < NV; ++v) acc[i][v] = V::fma(av, bv[v], acc[i][v]);
      }
      b += b_ks;
    }
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      float* row = c + i * ldc;
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) {
        if (accumulate) acc[i][v] = V::add(acc[i][v], V::load(row + v * W));
        V::store(row + v * W, acc[i][v]);
      }
    }
  }

  // A row-major (k contiguous) is read in place but for a partial last row panel; B
  // row-major (columns contiguous) is read in place when the tile has whole NR panels.
  // Everything else is packed (and widened) first.
  template <class E>
  static void packed_tile(const GemmProblem& p, int64_t batch, int64_t i0, int64_t j0,
                          const TileShape& shape, Scratch& s) {
    const int64_t mc = std::min(shape.rows, p.m - i0), nc = std::min(shape.columns, p.n - j0);
    const int64_t mcp = round_up(mc, MR), ncp = round_up(nc, NR);
    const int64_t lda = p.a.row_stride, ldb = p.b.row_stride;
    // bf16 is never read in place by the micro-kernel: every broadcast of A would cost a
    // load, shift and move instead of one broadcast load, and every vector of B a widening.
    // Row-major bf16 A is widened row by row into scratch (vector conversions, no transpose)
    // and read from there as float32 A is in place; B is packed.
    constexpr bool is_f32 = std::is_same_v<E, float>;
    const bool a_rows = p.a.col_stride == 1;  // A row-major: read by rows, not packed
    const bool b_direct = b_read_in_place(p) && nc % NR == 0;
    const int64_t a_full = a_rows ? mc - mc % MR : 0;  // rows read row-major
    const E* bias = bias_of<E>(p, batch, i0, j0);
    E* out =
        static_cast<E*>(p.c) + batch * p.c_batch_stride + i0 * p.c_row_stride + j0 * p.c_col_stride;
    // A float32 result accumulates in the output itself (whole register tiles), skipping the
    // staging tile; its scale and bias are applied there after the last k slice. Short-k
    // products (a weight gradient over few tokens) are otherwise dominated by that extra
    // pass over the output.
    const bool direct_out = is_f32 && p.k > 0 && p.c_col_stride == 1;
    const int64_t mc_full = mc - mc % MR, nc_full = nc - nc % NR;
    reserve_scratch(s.a, mcp * KC);
    reserve_scratch(s.b, ncp * KC);
    // The first k slice writes every staged register tile, so only k = 0 reads zeros here.
    if (!direct_out || mc_full < mc || nc_full < nc) reserve_scratch(s.c, mcp * ncp);
    if (p.k == 0) std::fill(s.c.begin(), s.c.begin() + mcp * ncp, 0.0f);
    const E* a = static_cast<const E*>(p.a.data) + batch * p.a.batch_stride + i0 * lda;
    const E* b = static_cast<const E*>(p.b.data) + batch * p.b.batch_stride + j0 * p.b.col_stride;
    for (int64_t p0 = 0; p0 < p.k; p0 += KC) {
      const int64_t kc = std::min(KC, p.k - p0);
      const E* a_k = a + p0 * p.a.col_stride;
      const E* b_k = b + p0 * ldb;
      if (a_full < mc) {
        pack_a(a_k + a_full * lda, lda, p.a.col_stride, mc - a_full, kc, s.a.data() + a_full * kc);
      }
      // Where the row-major rows are read: in place (float32) or widened, row stride kc.
      const float* a_row_data = s.a.data();
      int64_t a_ld = kc;
      if constexpr (is_f32) {
        a_row_data = a_k;
        a_ld = lda;
      } else {
        widen_rows(a_k, lda, a_full, kc, s.a.data());
      }
      if (!b_direct) pack_b(b_k, ldb, p.b.col_stride, kc, nc, s.b.data());
      for (int64_t jr = 0; jr < ncp; jr += NR) {
        for (int64_t ir = 0; ir < mcp; ir += MR) {
          const bool in_place = direct_out && ir < mc_full && jr < nc_full;
          float* c = in_place ? reinterpret_cast<float*>(out) + ir * p.c_row_stride + jr
                              : s.c.data() + ir * ncp + jr;
          const int64_t ldc = in_place ? p.c_row_stride : ncp;
          const bool acc = p0 > 0;
          if (ir < a_full) {
            if (b_direct) {
              micro_kernel(a_row_data + ir * a_ld, a_ld, 1, b_k + jr, ldb, kc, c, ldc, acc);
            } else {
              micro_kernel(a_row_data + ir * a_ld, a_ld, 1, s.b.data() + jr * kc, NR, kc, c, ldc,
                           acc);
            }
          } else if (b_direct) {
            micro_kernel(s.a.data() + ir * kc, 1, MR, b_k + jr, ldb, kc, c, ldc, acc);
          } else {
            micro_kernel(s.a.data() + ir * kc, 1, MR, s.b.data() + jr * kc, NR, kc, c, ldc, acc);
          }
        }
      }
    }
    if (!direct_out) {
      finish_staged(p, bias, out, s.c.data(), ncp, mc, nc);
      return;
    }
    // Only the partial tiles at the edges were staged.
    for (int64_t i = 0; i < mc; ++i) {
      for (int64_t j = i < mc_full ? nc_full : 0; j < nc; ++j) {
        finish(p, bias, out, i, j, s.c[i * ncp + j]);
      }
    }
    // The whole register tiles' scale and bias, applied in place by the same epilogue.
    if constexpr (is_f32) {
      if (bias != nullptr || p.alpha != 1.0f) {
        finish_staged(p, bias, out, out, p.c_row_stride, mc_full, nc_full);
      }
    }
  }

  // mc × nc float32 results c (row stride ldc) into the output, scaled and biased: from a
  // staging tile, or in place (c == out, float32 results accumulated in the output). A
  // transposed product's output (unit row stride) is written down its columns, so the stores
  // are contiguous; a row-major one a vector at a time (bf16 rounded to nearest even in
  // registers). With unit scale and bias weight the epilogue is the one add, rounded once in
  // any order; other forms take finish() per element.
  template <class E>
  static void finish_staged(const GemmProblem& p, const E* bias, E* out, const float* c,
                            int64_t ldc, int64_t mc, int64_t nc) {
    const bool plain = p.alpha == 1.0f && (bias == nullptr || p.beta == 1.0f);
    if (p.c_row_stride == 1 && plain) {
      for (int64_t j = 0; j < nc; ++j) {
        E* column = out + j * p.c_col_stride;
        const E* b = bias == nullptr ? nullptr : bias + j * p.bias.col_stride;
        for (int64_t i = 0; i < mc; ++i) {
          const float v = c[i * ldc + j];
          store_as(column + i, b == nullptr ? v : v + to_f32(b[i * p.bias.row_stride]));
        }
      }
      return;
    }
    if (p.c_col_stride == 1 && plain && (bias == nullptr || p.bias.col_stride == 1)) {
      for (int64_t i = 0; i < mc; ++i) {
        E* row = out + i * p.c_row_stride;
        const float* src = c + i * ldc;
        const E* b = bias == nullptr ? nullptr : bias + i * p.bias.row_stride;
        int64_t j = 0;
        for (; j + W <= nc; j += W) {
          const typename V::Reg v = V::load(src + j);
          V::store(row + j, b == nullptr ? v : V::add(v, V::load(b + j)));
        }
        for (; j < nc; ++j) store_as(row + j, b == nullptr ? src[j] : src[j] + to_f32(b[j]));
      }
      return;
    }
    for (int64_t i = 0; i < mc; ++i) {
      for (int64_t j = 0; j < nc; ++j) finish(p, bias, out, i, j, c[i * ldc + j]);
    }
  }

  template <class E>
  static void packed(const GemmProblem& p, const ParallelFor& par) {
    if (should_transpose(p)) {
      const GemmProblem t = transposed(p);
      packed<E>(t, par);
      return;
    }
    if constexpr (NV > 1) {
      if (p.n <= W) {
        GemmTiles<V, MR * NV, 1>::template packed<E>(p, par);
        return;
      }
    }
    const TileShape shape = tile_shape(p, par.threads);
    const int64_t mt = shape.row_tiles(p), nt = shape.column_tiles(p);
    par.run(p.batch * mt * nt, [&](int64_t begin, int64_t end) {
      static thread_local Scratch scratch;
      for (int64_t t = begin; t < end; ++t) {
        const int64_t batch = t / (mt * nt), rest = t % (mt * nt);
        packed_tile<E>(p, batch, (rest / nt) * shape.rows, (rest % nt) * shape.columns, shape,
                       scratch);
      }
    });
  }

  // The output tile one task computes: MC × NC, or narrower when several threads share the
  // product, until each has kTasksPerThread tiles. Tasks are handed out one at a time, so
  // the threads finish up to a tile apart: with 3 tiles for 2 threads (a 64-row product,
  // a k/v projection) one thread idled a third of the time. Only where it repacks nothing:
  // columns when A is row-major (read in place, or widened per tile anyway), rows when B
  // is read in place. Otherwise every halving packs the other operand once more, which
  // cost more than the balance gained (a transposed 64 × 768 × 2048 forward, its 2048-deep
  // B packed per tile, went from 1.6-1.9x CPU eager's wall rate to 1.5x). Down to 4
  // register tiles a side.
  static constexpr int64_t kTasksPerThread = 4;
  static TileShape tile_shape(const GemmProblem& p, int threads) {
    TileShape shape;
    // Tiles no larger than the product, so halving one always adds tiles.
    shape.rows = std::min(MC, round_up(p.m, MR));
    shape.columns = std::min(NC, round_up(p.n, NR));
    if (threads <= 1) return shape;
    const bool a_rows = p.a.col_stride == 1;
    const bool b_in_place = b_read_in_place(p);
    const int64_t wanted = kTasksPerThread * threads;
    while (p.batch * shape.row_tiles(p) * shape.column_tiles(p) < wanted) {
      if (a_rows && shape.columns >= 8 * NR) {
        shape.columns = round_up(shape.columns / 2, NR);
      } else if (b_in_place && shape.rows >= 8 * MR) {
        shape.rows = round_up(shape.rows / 2, MR);
      } else {
        break;
      }
    }
    return shape;
  }

  // B = Wᵀ (W row-major) with fewer rows of A than columns of B, e.g. a linear layer's
  // forward at prefill sizes: computing Cᵀ = Bᵀ·Aᵀ reads W in place and packs only the
  // smaller activation matrix. Its output is strided, so it is staged and stored one element
  // at a time: that costs more than packing W (once per MC rows of A) unless k is long
  // against m (a short-k product such as a LoRA up-projection stays as it is).
  static bool should_transpose(const GemmProblem& p) {
    if (!(p.b.col_stride != 1 && p.b.row_stride == 1 && p.a.col_stride == 1 && p.m < p.n)) {
      return false;
    }
    const int64_t row_tiles = (p.m + MC - 1) / MC;
    return 2 * p.m < p.k * row_tiles;
  }

  static GemmProblem transposed(const GemmProblem& p) {
    GemmProblem t = p;
    t.m = p.n;
    t.n = p.m;
    t.a = {p.b.data, p.b.col_stride, p.b.row_stride, p.b.batch_stride};
    t.b = {p.a.data, p.a.col_stride, p.a.row_stride, p.a.batch_stride};
    t.bias = {p.bias.data, p.bias.col_stride, p.bias.row_stride, p.bias.batch_stride};
    t.c_row_stride = p.c_col_stride;
    t.c_col_stride = p.c_row_stride;
    return t;
  }

  static bool gemv_rows(const GemmProblem& p) {
    return p.m <= GemvRows<V>::kMaxRows && p.b.row_stride == 1;
  }

  // Few columns, e.g. W·x with x one column: Cᵀ = xᵀ·Wᵀ is a GEMV streaming W's rows.
  // Packed, the NR-wide panels would waste NR - n of every NR products.
  static bool gemv_columns_transposed(const GemmProblem& p) {
    return !gemv_rows(p) && p.n <= GemvRows<V>::kMaxRows && p.n < p.m && p.a.col_stride == 1;
  }

  template <class E>
  static void run_typed(const GemmProblem& p, const ParallelFor& par) {
    if (gemv_rows(p)) {
      GemvRows<V>::template gemv<E>(p, par);
    } else if (gemv_columns_transposed(p)) {
      GemvRows<V>::template gemv<E>(transposed(p), par);
    } else {
      packed<E>(p, par);
    }
  }

  static void run(const GemmProblem& p, const ParallelFor& par) {
    if (p.dtype == GemmDtype::kFloat32) {
      run_typed<float>(p, par);
    } else {
      run_typed<uint16_t>(p, par);
    }
  }
};

}  // namespace
}  // namespace neuron::kernels
