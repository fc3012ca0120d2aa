// The GEMV path of the GEMM (gemm_tiles.h), over a vector type V: m ≤ 8 activation rows
// against a weight matrix whose k index is contiguous, i.e. the forward X·Wᵀ of decode (or
// its transpose). Memory-bound: each weight row is streamed once, bf16 widened to float32 in
// registers, with the activation rows held in cache; the point is to read W exactly once at
// full bandwidth. Internal linkage, as gemm_tiles.h.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "gemm_elements.h"

namespace neuron::kernels {
namespace {

template <class V>
struct GemvRows {
  static constexpr int W = V::kWidth;
  static constexpr int64_t kMaxRows = 8;

  // One weight row (output column j) against MB ≥ 2 activation rows, over all of k:
  // dots[r]. W is read once in memory order, a single sequential stream the hardware
  // prefetcher follows; adjacent rows interleaved are as many short streams, which it tracks
  // badly (a 98 MB float32 LM head streamed at 14 GB/s that way, against 21 GB/s for a sum).
  // U accumulators per activation row break the chain of dependent FMAs. (float32 W; bf16 W
  // takes gemv_row_pairs; one activation row takes row_dots.)
  template <int MB>
  static void gemv_row(const float* x, int64_t k, const float* w, float* dots) {
    constexpr int U = MB >= 4 ? 1 : 4 / MB;
    typename V::Reg acc[MB][U];
#pragma GCC unroll 8
    for (int r = 0; r < MB; ++r) {
#pragma GCC unroll 4
      for (int u = 0; u < U; ++u) acc[r][u] = V::zero();
    }
    int64_t kk = 0;
    for (; kk + U * W <= k; kk += U * W) {
#pragma GCC unroll 4
      for (int u = 0; u < U; ++u) {
        const typename V::Reg wv = V::load(w + kk + u * W);
#pragma GCC unroll 8
        for (int r = 0; r < MB; ++r) {
          acc[r][u] = V::fma(V::load(x + r * k + kk + u * W), wv, acc[r][u]);
        }
      }
    }
    for (; kk + W <= k; kk += W) {
      const typename V::Reg wv = V::load(w + kk);
#pragma GCC unroll 8
      for (int r = 0; r < MB; ++r) acc[r][0] = V::fma(V::load(x + r * k + kk), wv, acc[r][0]);
    }
    for (int r = 0; r < MB; ++r) {
      typename V::Reg sum = acc[r][0];
      for (int u = 1; u < U; ++u) sum = V::add(sum, acc[r][u]);
      float tail = 0.0f;
      for (int64_t t = kk; t < k; ++t) tail += x[r * k + t] * w[t];
      dots[r] = V::sum(sum) + tail;
    }
  }

  // gemv_row for bf16 W, read 2W elements at a time as W pairs (V::load_pairs): widening
  // element by element made the GEMV compute-bound on hosts without bf16 instructions. The
  // activation rows come laid out to match (split_pairs); the tail past the last whole
  // block stays in order. W is prefetched kGemvPrefetchBytes ahead: with three loads per
  // vector of W (W and two of x) the hardware prefetcher alone kept it at 0.65-0.78 of a
  // plain sum's rate from memory, 0.67-0.82 with it (1.05x median over 9 runs, AVX2 host).
  // For MB ≥ 2 (one activation row takes row_dots).
  static constexpr int64_t kGemvPrefetchBytes = 1024;
  template <int MB>
  static void gemv_row_pairs(const float* x, int64_t k, const uint16_t* w, float* dots) {
    constexpr int64_t B = 2 * W;  // elements per block
    typename V::Reg acc[MB][2];
#pragma GCC unroll 8
    for (int r = 0; r < MB; ++r) acc[r][0] = acc[r][1] = V::zero();
    int64_t kk = 0;
    for (; kk + B <= k; kk += B) {
      // Every line of the block's W, kGemvPrefetchBytes ahead (past the row's end: the next
      // rows, which come next).
      const char* ahead = reinterpret_cast<const char*>(w + kk) + kGemvPrefetchBytes;
      for (int64_t line = 0; line < B * int64_t{sizeof(uint16_t)}; line += 64) {
        __builtin_prefetch(ahead + line, 0, 3);
      }
      typename V::Reg even, odd;
      V::load_pairs(w + kk, &even, &odd);
#pragma GCC unroll 8
      for (int r = 0; r < MB; ++r) {
        acc[r][0] = V::fma(V::load(x + r * k + kk), even, acc[r][0]);
        acc[r][1] = V::fma(V::load(x + r * k + kk + W), odd, acc[r][1]);
      }
    }
    for (int r = 0; r < MB; ++r) {
      float tail = 0.0f;
      for (int64_t t = kk; t < k; ++t) tail += x[r * k + t] * to_f32(w[t]);
      dots[r] = V::sum(V::add(acc[r][0], acc[r][1])) + tail;
    }
  }

  // One activation row (decode) against R weight rows at once: each vector of x is loaded
  // once for the R rows, where a row at a time loaded it once per vector of W (two per
  // vector of bf16 W, widened in pairs). Each row keeps two chains of FMAs (an even and an
  // odd block, or a low and a high vector) and then its tail, whatever R is, so a row's bits
  // do not depend on how rows are grouped. Measured single-threaded over the 100M Llama's
  // five weight shapes from memory (AVX2 host), four rows against one at a time: float32
  // 15.7-26.0 against 11.2-20.3 GB/s, bf16 12.5-25.5 against 12.1-19.3 GB/s.
  template <int R>
  static void row_dots(const float* x, int64_t k, const float* const* w, float* dots) {
    typename V::Reg lo[R], hi[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) lo[r] = hi[r] = V::zero();
    int64_t kk = 0;
    for (; kk + 2 * W <= k; kk += 2 * W) {
      const typename V::Reg x0 = V::load(x + kk), x1 = V::load(x + kk + W);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        lo[r] = V::fma(x0, V::load(w[r] + kk), lo[r]);
        hi[r] = V::fma(x1, V::load(w[r] + kk + W), hi[r]);
      }
    }
    for (int r = 0; r < R; ++r) {
      float tail = 0.0f;
      for (int64_t t = kk; t < k; ++t) tail += x[t] * w[r][t];
      dots[r] = V::sum(V::add(lo[r], hi[r])) + tail;
    }
  }

  // The same for bf16 W, x laid out by split_pairs; each row's W is also prefetched a line
  // at a time (see gemv_row_pairs).
  template <int R>
  static void row_dots(const float* x, int64_t k, const uint16_t* const* w, float* dots) {
    constexpr int64_t B = 2 * W;
    constexpr int64_t kBlocksPerLine = std::max<int64_t>(1, 64 / (B * 2));
    typename V::Reg even_acc[R], odd_acc[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) even_acc[r] = odd_acc[r] = V::zero();
    auto block = [&](int64_t kk) {
      const typename V::Reg xe = V::load(x + kk), xo = V::load(x + kk + W);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        typename V::Reg even, odd;
        V::load_pairs(w[r] + kk, &even, &odd);
        even_acc[r] = V::fma(xe, even, even_acc[r]);
        odd_acc[r] = V::fma(xo, odd, odd_acc[r]);
      }
    };
    int64_t kk = 0;
    for (; kk + kBlocksPerLine * B <= k; kk += kBlocksPerLine * B) {
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        __builtin_prefetch(reinterpret_cast<const char*>(w[r] + kk) + kGemvPrefetchBytes, 0, 3);
      }
#pragma GCC unroll 4
      for (int64_t q = 0; q < kBlocksPerLine; ++q) block(kk + q * B);
    }
    for (; kk + B <= k; kk += B) block(kk);
    for (int r = 0; r < R; ++r) {
      float tail = 0.0f;
      for (int64_t t = kk; t < k; ++t) tail += x[t] * to_f32(w[r][t]);
      dots[r] = V::sum(V::add(even_acc[r], odd_acc[r])) + tail;
    }
  }

  // Output columns [j0, j1) of one activation row, four weight rows at a time: rows j,
  // j + q, j + 2q, j + 3q for q a quarter of the columns, so that each of the four streams
  // runs sequentially through its quarter (adjacent rows taken together are four short
  // streams restarting at every row, which the prefetcher follows badly: see gemv_row).
  // The columns left over go one at a time.
  template <class E>
  static void grouped_columns(const GemmProblem& p, const float* x, const E* w, const E* bias,
                              E* out, int64_t j0, int64_t j1) {
    constexpr int R = 4;
    const int64_t q = (j1 - j0) / R;
    const E* rows[R];
    float dots[R];
    for (int64_t j = j0; j < j0 + q; ++j) {
      for (int r = 0; r < R; ++r) rows[r] = w + (j + r * q) * p.b.col_stride;
      row_dots<R>(x, p.k, rows, dots);
      for (int r = 0; r < R; ++r) finish(p, bias, out, 0, j + r * q, dots[r]);
    }
    for (int64_t j = j0 + R * q; j < j1; ++j) {
      rows[0] = w + j * p.b.col_stride;
      row_dots<1>(x, p.k, rows, dots);
      finish(p, bias, out, 0, j, dots[0]);
    }
  }

  // The layout gemv_row_pairs reads activations in: each whole block of 2W floats of a row
  // as its W even-indexed elements, then its W odd-indexed ones.
  static void split_pairs(float* row, int64_t k) {
    float block[2 * W];
    for (int64_t b = 0; b + 2 * W <= k; b += 2 * W) {
      for (int i = 0; i < W; ++i) {
        block[i] = row[b + 2 * i];
        block[W + i] = row[b + 2 * i + 1];
      }
      std::copy(block, block + 2 * W, row + b);
    }
  }

  // Output columns [j0, j1) of a GEMV batch entry, for activation rows in chunks of MB.
  template <class E, int MB>
  static void gemv_columns(const GemmProblem& p, int64_t batch, const float* x, int64_t rows,
                           int64_t j0, int64_t j1) {
    const E* w = static_cast<const E*>(p.b.data) + batch * p.b.batch_stride;
    const E* bias = bias_of<E>(p, batch, 0, 0);
    E* out = static_cast<E*>(p.c) + batch * p.c_batch_stride;
    if constexpr (MB == 1) {  // one activation row
      grouped_columns(p, x, w, bias, out, j0, j1);
    } else {
      float dots[MB];
      for (int64_t j = j0; j < j1; ++j) {
        for (int64_t r0 = 0; r0 < rows; r0 += MB) {
          if constexpr (std::is_same_v<E, uint16_t>) {
            gemv_row_pairs<MB>(x + r0 * p.k, p.k, w + j * p.b.col_stride, dots);
          } else {
            gemv_row<MB>(x + r0 * p.k, p.k, w + j * p.b.col_stride, dots);
          }
          for (int64_t r = 0; r < std::min<int64_t>(MB, rows - r0); ++r) {
            finish(p, bias, out, r0 + r, j, dots[r]);
          }
        }
      }
    }
  }

  // Activation rows per GEMV pass for m rows (the padded rows of the last pass are zero).
  static constexpr int64_t gemv_rows_per_pass(int64_t m) {
    return m >= 5 ? 8 : m >= 3 ? 4 : m == 2 ? 2 : 1;
  }

  // A GEMV's output columns per task: a few tasks per thread so uneven threads even out,
  // each a multiple of 8 rows of W.
  static int64_t gemv_chunk(const GemmProblem& p, const ParallelFor& par) {
    const int64_t chunks_per_batch =
        std::max<int64_t>(1, std::min<int64_t>((p.n + 63) / 64, int64_t{par.threads} * 4));
    return round_up((p.n + chunks_per_batch - 1) / chunks_per_batch, 8);
  }

  template <class E>
  static void gemv(const GemmProblem& p, const ParallelFor& par) {
    const int64_t chunk = gemv_chunk(p, par);
    const int64_t per_batch = (p.n + chunk - 1) / chunk;
    par.run(p.batch * per_batch, [&](int64_t begin, int64_t end) {
      static thread_local std::vector<float> x;
      int64_t packed_batch = -1;
      for (int64_t t = begin; t < end; ++t) {
        const int64_t batch = t / per_batch, j0 = (t % per_batch) * chunk;
        if (batch != packed_batch) {  // the activation rows, float32 and contiguous
          // Zero rows pad the last pass (only those need clearing: the rest is written).
          x.resize(round_up(p.m, gemv_rows_per_pass(p.m)) * p.k);
          std::fill(x.begin() + p.m * p.k, x.end(), 0.0f);
          const E* a = static_cast<const E*>(p.a.data) + batch * p.a.batch_stride;
          for (int64_t i = 0; i < p.m; ++i) {
            for (int64_t kk = 0; kk < p.k; ++kk) {
              x[i * p.k + kk] = to_f32(a[i * p.a.row_stride + kk * p.a.col_stride]);
            }
            if constexpr (std::is_same_v<E, uint16_t>) split_pairs(x.data() + i * p.k, p.k);
          }
          packed_batch = batch;
        }
        const int64_t j1 = std::min(p.n, j0 + chunk);
        if (p.m >= 5) {
          gemv_columns<E, 8>(p, batch, x.data(), p.m, j0, j1);
        } else if (p.m >= 3) {
          gemv_columns<E, 4>(p, batch, x.data(), p.m, j0, j1);
        } else if (p.m >= 2) {
          gemv_columns<E, 2>(p, batch, x.data(), p.m, j0, j1);
        } else {
          gemv_columns<E, 1>(p, batch, x.data(), p.m, j0, j1);
        }
      }
    });
  }
};

}  // namespace
}  // namespace neuron::kernels
