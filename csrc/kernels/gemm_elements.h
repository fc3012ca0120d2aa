// Element conversions and the finishing of one output element, shared by the GEMM's packed
// path (gemm_tiles.h), its GEMV path (gemv_rows.h) and the bf16-instruction kernels. Internal
// linkage, like the algorithm headers that include it: each instruction set's copy stays its
// own.
#pragma once

#include <cstdint>
#include <vector>

#include "gemm.h"

namespace neuron::kernels {
namespace {

inline float to_f32(float v) { return v; }
inline float to_f32(uint16_t v) { return bf16_to_float(v); }
inline void store_as(float* p, float v) { *p = v; }
inline void store_as(uint16_t* p, float v) { *p = float_to_bf16_rne(v); }

constexpr int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// Grows a scratch buffer to at least n elements and never shrinks it: sized down and back up
// by tiles of different sizes, it would zero the regrown part on every call.
template <class T>
void reserve_scratch(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
}

// The scaled, biased result of one output element (in float32).
template <class E>
inline float scaled(const GemmProblem& p, const E* bias, int64_t i, int64_t j, float acc) {
  float v = p.alpha == 1.0f ? acc : p.alpha * acc;
  if (bias != nullptr) v += p.beta * to_f32(bias[i * p.bias.row_stride + j * p.bias.col_stride]);
  return v;
}

// The scaled, biased result of one output element, stored in the output dtype.
template <class E>
inline void finish(const GemmProblem& p, const E* bias, E* out, int64_t i, int64_t j, float acc) {
  store_as(out + i * p.c_row_stride + j * p.c_col_stride, scaled(p, bias, i, j, acc));
}

// The bias of batch entry `batch` from output element (i0, j0), or null when none applies.
template <class E>
const E* bias_of(const GemmProblem& p, int64_t batch, int64_t i0, int64_t j0) {
  if (p.bias.data == nullptr || p.beta == 0.0f) return nullptr;
  return static_cast<const E*>(p.bias.data) + batch * p.bias.batch_stride + i0 * p.bias.row_stride +
         j0 * p.bias.col_stride;
}

}  // namespace
}  // namespace neuron::kernels
