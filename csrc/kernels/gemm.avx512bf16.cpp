// GEMM at the AVX512-BF16 level. bf16 products that are compute-bound use vdpbf16ps: A and
// B are packed as bf16 k-pairs (no widening), and each instruction multiplies 16 lanes × 2
// bf16 pairs into float32 accumulators — twice the multiply-adds of a float32 FMA. The
// instruction flushes denormals and rounds its pair sum to nearest even, so results can
// differ from the float32-FMA path in the last bits. bf16 GEMVs take gemv_bf16_pairs (the
// same instruction: widening bf16 to float32 made them compute-bound); float32 problems take
// the AVX-512F kernels.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gemm_isa.h"
#include "gemm_tiles.h"
#include "gemm_vec_avx512.h"

namespace neuron::kernels::detail {
namespace {

using F32Tiles = GemmTiles<Avx512Vec, 8>;

struct Bf16PairTiles {
  static constexpr int MR = 8;
  static constexpr int NR = 32;
  static constexpr int64_t KC = 512;  // in k, a multiple of 2
  static constexpr int64_t MC = MR * 32;
  static constexpr int64_t NC = NR * 16;

  struct Scratch {
    std::vector<uint16_t> a, b;
    std::vector<float> c;
  };

  // A's rows [0, mc) × k [0, kc) as MR-row panels of k-pairs: (k/2, row, k%2).
  static void pack_a(const uint16_t* a, int64_t rs, int64_t cs, int64_t mc, int64_t kc,
                     uint16_t* dst) {
    const int64_t kcp = round_up(kc, 2);
    for (int64_t r0 = 0; r0 < mc; r0 += MR) {
      const int64_t rows = std::min<int64_t>(MR, mc - r0);
      uint16_t* panel = dst + (r0 / MR) * kcp * MR;
      std::fill(panel, panel + kcp * MR, uint16_t{0});
      for (int64_t i = 0; i < rows; ++i) {
        const uint16_t* src = a + (r0 + i) * rs;
        int64_t k = 0;
        if (cs == 1) {  // row-major A: each k-pair is one 32-bit word
          auto* panel32 = reinterpret_cast<uint32_t*>(panel);
          for (; k + 2 <= kc; k += 2) {
            uint32_t pair;
            __builtin_memcpy(&pair, src + k, sizeof(pair));
            panel32[(k >> 1) * MR + i] = pair;
          }
        }
        for (; k < kc; ++k) panel[(k >> 1) * MR * 2 + i * 2 + (k & 1)] = src[k * cs];
      }
    }
  }

  // B's k [0, kc) × columns [0, nc) as NR-column panels of k-pairs: (k/2, column, k%2).
  static void pack_b(const uint16_t* b, int64_t rs, int64_t cs, int64_t kc, int64_t nc,
                     uint16_t* dst) {
    const int64_t kcp = round_up(kc, 2);
    for (int64_t c0 = 0; c0 < nc; c0 += NR) {
      const int64_t cols = std::min<int64_t>(NR, nc - c0);
      uint16_t* panel = dst + (c0 / NR) * kcp * NR;
      if (cols < NR || kc % 2) std::fill(panel, panel + kcp * NR, uint16_t{0});
      if (cs == 1) {
        for (int64_t k = 0; k < kc; ++k) {
          const uint16_t* src = b + k * rs + c0;
          uint16_t* row = panel + (k >> 1) * NR * 2 + (k & 1);
          for (int64_t j = 0; j < cols; ++j) row[j * 2] = src[j];
        }
      } else if (rs == 1) {  // W row-major (B = Wᵀ): each k-pair is one 32-bit word of W
        auto* panel32 = reinterpret_cast<uint32_t*>(panel);
        for (int64_t j = 0; j < cols; ++j) {
          const uint16_t* src = b + (c0 + j) * cs;
          int64_t k = 0;
          for (; k + 2 <= kc; k += 2) {
            uint32_t pair;
            __builtin_memcpy(&pair, src + k, sizeof(pair));
            panel32[(k >> 1) * NR + j] = pair;
          }
          if (k < kc) panel[(k >> 1) * NR * 2 + j * 2] = src[k];
        }
      } else {
        for (int64_t j = 0; j < cols; ++j) {
          const uint16_t* src = b + (c0 + j) * cs;
          for (int64_t k = 0; k < kc; ++k) panel[(k >> 1) * NR * 2 + j * 2 + (k & 1)] = src[k * rs];
        }
      }
    }
  }

  // A's k-pair of row i is the 32-bit word at a + i·a_rs + kp·a_ks (uint16 units; packed:
  // 2, 2·MR; a row-major A in place: lda, 2).
  static void micro_kernel(const uint16_t* a, int64_t a_rs, int64_t a_ks, const uint16_t* bp,
                           int64_t kpairs, float* c, int64_t ldc, bool accumulate) {
    __m512 acc[MR][2];
    const uint16_t* rows[MR];
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      acc[i][0] = acc[i][1] = _mm512_setzero_ps();
      rows[i] = a + i * a_rs;
    }
    for (int64_t kp = 0; kp < kpairs; ++kp) {
      const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp);
      const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + 32);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        uint32_t pair;
        __builtin_memcpy(&pair, rows[i], sizeof(pair));
        rows[i] += a_ks;
        const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
        acc[i][0] = _mm512_dpbf16_ps(acc[i][0], av, b0);
        acc[i][1] = _mm512_dpbf16_ps(acc[i][1], av, b1);
      }
      bp += NR * 2;
    }
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      float* row = c + i * ldc;
      if (accumulate) {
        acc[i][0] = _mm512_add_ps(acc[i][0], _mm512_loadu_ps(row));
        acc[i][1] = _mm512_add_ps(acc[i][1], _mm512_loadu_ps(row + 16));
      }
      _mm512_storeu_ps(row, acc[i][0]);
      _mm512_storeu_ps(row + 16, acc[i][1]);
    }
  }

  static void tile(const GemmProblem& p, int64_t batch, int64_t i0, int64_t j0, Scratch& s) {
    const int64_t mc = std::min(MC, p.m - i0), nc = std::min(NC, p.n - j0);
    const int64_t mcp = round_up(mc, MR), ncp = round_up(nc, NR);
    reserve_scratch(s.a, mcp * KC);
    reserve_scratch(s.b, ncp * KC);
    reserve_scratch(s.c, mcp * ncp);  // the first k slice writes every tile
    if (p.k == 0) std::fill(s.c.begin(), s.c.begin() + mcp * ncp, 0.0f);
    const auto* a =
        static_cast<const uint16_t*>(p.a.data) + batch * p.a.batch_stride + i0 * p.a.row_stride;
    const auto* b =
        static_cast<const uint16_t*>(p.b.data) + batch * p.b.batch_stride + j0 * p.b.col_stride;
    const int64_t lda = p.a.row_stride;
    for (int64_t p0 = 0; p0 < p.k; p0 += KC) {
      const int64_t kc = std::min(KC, p.k - p0), kcp = round_up(kc, 2);
      // A row-major with whole k-pairs is read in place (but a partial last row panel).
      const int64_t a_full = p.a.col_stride == 1 && kc % 2 == 0 ? mc - mc % MR : 0;
      const uint16_t* a_k = a + p0 * p.a.col_stride;
      if (a_full < mc) {
        pack_a(a_k + a_full * lda, lda, p.a.col_stride, mc - a_full, kc, s.a.data() + a_full * kcp);
      }
      pack_b(b + p0 * p.b.row_stride, p.b.row_stride, p.b.col_stride, kc, nc, s.b.data());
      for (int64_t jr = 0; jr < ncp; jr += NR) {
        for (int64_t ir = 0; ir < mcp; ir += MR) {
          float* c = s.c.data() + ir * ncp + jr;
          if (ir < a_full) {
            micro_kernel(a_k + ir * lda, lda, 2, s.b.data() + jr * kcp, kcp / 2, c, ncp, p0 > 0);
          } else {
            micro_kernel(s.a.data() + ir * kcp, 2, 2 * MR, s.b.data() + jr * kcp, kcp / 2, c, ncp,
                         p0 > 0);
          }
        }
      }
    }
    const uint16_t* bias = bias_of<uint16_t>(p, batch, i0, j0);
    uint16_t* out = static_cast<uint16_t*>(p.c) + batch * p.c_batch_stride + i0 * p.c_row_stride +
                    j0 * p.c_col_stride;
    F32Tiles::finish_staged(p, bias, out, s.c.data(), ncp, mc, nc);
  }

  static void run(const GemmProblem& p, const ParallelFor& par) {
    if (F32Tiles::should_transpose(p)) {
      run(F32Tiles::transposed(p), par);
      return;
    }
    const int64_t mt = (p.m + MC - 1) / MC, nt = (p.n + NC - 1) / NC;
    par.run(p.batch * mt * nt, [&](int64_t begin, int64_t end) {
      static thread_local Scratch scratch;
      for (int64_t t = begin; t < end; ++t) {
        const int64_t batch = t / (mt * nt), rest = t % (mt * nt);
        tile(p, batch, (rest / nt) * MC, (rest % nt) * NC, scratch);
      }
    });
  }
};

}  // namespace

void gemm_avx512_bf16(const GemmProblem& problem, const ParallelFor& parallel) {
  if (problem.dtype != GemmDtype::kBFloat16) {
    F32Tiles::run(problem, parallel);
  } else if (F32Tiles::gemv_rows(problem)) {
    gemv_bf16_pairs(problem, parallel);
  } else if (F32Tiles::gemv_columns_transposed(problem)) {
    gemv_bf16_pairs(F32Tiles::transposed(problem), parallel);
  } else {
    Bf16PairTiles::run(problem, parallel);
  }
}

}  // namespace neuron::kernels::detail
