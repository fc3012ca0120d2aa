// bfloat16 GEMV at the AVX512-BF16 level (decode: a few activation rows against every row
// of W). vdpbf16ps multiplies 32 bf16 weights by 32 bf16 activations into 16 float32 lanes
// in one instruction, straight from the loaded cache line, where widening bf16 to float32
// takes a zero-extend, a shift and two FMAs: cache-resident weights stream 1.1-1.6x faster.
// Activations are bf16 already, so packing them as bf16 is exact; the instruction flushes
// denormals and rounds each pair sum to nearest even (as gemm.avx512bf16.cpp's packed
// kernel does).
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
constexpr int64_t kLanes = 32;  // bf16 values per 512-bit register (one cache line)

// One row of W against MB activation rows (bf16, row stride kp, zero beyond k up to kp):
// dots[r]. W is read once, in memory order: a single sequential stream the hardware
// prefetcher follows. (Several rows of W interleaved are as many short streams, which it
// tracked badly: the 49 MB LM head streamed at 9 GB/s that way, 19 GB/s this way.)
// U accumulators per activation row break the chain of dependent vdpbf16ps.
template <int MB>
void pair_row(const uint16_t* x, int64_t kp, int64_t k, const uint16_t* w, float* dots) {
  constexpr int U = MB >= 4 ? 1 : 4 / MB;
  __m512 acc[MB][U];
#pragma GCC unroll 8
  for (int r = 0; r < MB; ++r) {
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) acc[r][u] = _mm512_setzero_ps();
  }
  auto step = [&](int64_t kk, int u, __mmask32 mask) {
    const __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + kk);
#pragma GCC unroll 8
    for (int r = 0; r < MB; ++r) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + r * kp + kk);
      acc[r][u] = _mm512_dpbf16_ps(acc[r][u], xv, wv);
    }
  };
  int64_t kk = 0;
  for (; kk + U * kLanes <= k; kk += U * kLanes) {
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) step(kk + u * kLanes, u, ~__mmask32{0});
  }
  for (; kk < k; kk += kLanes) {
    const int64_t left = std::min<int64_t>(kLanes, k - kk);
    step(kk, 0, left == kLanes ? ~__mmask32{0} : static_cast<__mmask32>((1u << left) - 1));
  }
  for (int r = 0; r < MB; ++r) {
    __m512 sum = acc[r][0];
    for (int u = 1; u < U; ++u) sum = _mm512_add_ps(sum, acc[r][u]);
    dots[r] = Avx512Vec::sum(sum);
  }
}

// Output columns [j0, j1) of one batch entry, activation rows in chunks of MB.
template <int MB>
void pair_columns(const GemmProblem& p, int64_t batch, const uint16_t* x, int64_t kp, int64_t j0,
                  int64_t j1) {
  const auto* w = static_cast<const uint16_t*>(p.b.data) + batch * p.b.batch_stride;
  const uint16_t* bias = bias_of<uint16_t>(p, batch, 0, 0);
  auto* out = static_cast<uint16_t*>(p.c) + batch * p.c_batch_stride;
  float dots[MB];
  for (int64_t j = j0; j < j1; ++j) {
    for (int64_t r0 = 0; r0 < p.m; r0 += MB) {
      pair_row<MB>(x + r0 * kp, kp, p.k, w + j * p.b.col_stride, dots);
      for (int64_t r = 0; r < std::min<int64_t>(MB, p.m - r0); ++r) {
        finish(p, bias, out, r0 + r, j, dots[r]);
      }
    }
  }
}

}  // namespace

void gemv_bf16_pairs(const GemmProblem& p, const ParallelFor& par) {
  const int64_t chunk = GemvRows<Avx512Vec>::gemv_chunk(p, par);
  const int64_t per_batch = (p.n + chunk - 1) / chunk;
  const int64_t kp = round_up(std::max<int64_t>(p.k, 1), kLanes);
  par.run(p.batch * per_batch, [&](int64_t begin, int64_t end) {
    static thread_local std::vector<uint16_t> x;
    int64_t packed_batch = -1;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t batch = t / per_batch, j0 = (t % per_batch) * chunk;
      if (batch != packed_batch) {  // the activation rows, contiguous, zero-padded to kp and passes
        x.assign(round_up(p.m, GemvRows<Avx512Vec>::gemv_rows_per_pass(p.m)) * kp, 0);
        const auto* a = static_cast<const uint16_t*>(p.a.data) + batch * p.a.batch_stride;
        for (int64_t i = 0; i < p.m; ++i) {
          for (int64_t kk = 0; kk < p.k; ++kk) {
            x[i * kp + kk] = a[i * p.a.row_stride + kk * p.a.col_stride];
          }
        }
        packed_batch = batch;
      }
      const int64_t j1 = std::min(p.n, j0 + chunk);
      if (p.m >= 5) {
        pair_columns<8>(p, batch, x.data(), kp, j0, j1);
      } else if (p.m >= 3) {
        pair_columns<4>(p, batch, x.data(), kp, j0, j1);
      } else if (p.m == 2) {
        pair_columns<2>(p, batch, x.data(), kp, j0, j1);
      } else {
        pair_columns<1>(p, batch, x.data(), kp, j0, j1);
      }
    }
  });
}

}  // namespace neuron::kernels::detail
