"""C++ for row programs: the instruction bodies of :mod:`.row_programs` as C++ statements.

Every statement runs inside ``for (long r = 0; r < rows; ++r)`` and touches row ``r`` of its
outputs (and row ``r``, row 0 or row ``r % rows_per_iteration`` of its inputs). Engines
compute in float32; the helpers below follow numpy's float32 results (NaN and infinities
included) to within a few units in the last place: exp is a Cephes-style polynomial, so that
the compiler can vectorise it (glibc's expf is a scalar call).
"""

from __future__ import annotations

import math
from typing import Any

PRELUDE = r"""
#include <cmath>
#include <cstdint>
#include <cstring>

static inline float op_exp(float x) {
  const float hi = 88.72283f, lo = -87.33654f;
  float xc = x > hi ? hi : (x < lo ? lo : x);
  float n = std::floor(xc * 1.44269504088896341f + 0.5f);
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  float y = p * r * r + r + 1.0f;
  // 2^n as float bits; n reaches 128 just below the clamp (x > 88.03), past the largest
  // exponent, so that case scales by 2^127 and then by 2
  int32_t e = static_cast<int32_t>(n);
  float twice = e > 127 ? 2.0f : 1.0f;
  e = e > 127 ? 127 : e;
  int32_t bits = (e + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  y = y * scale * twice;
  y = x > hi ? INFINITY : y;
  y = x < lo ? 0.0f : y;
  return x != x ? x : y;
}
static inline float op_sigmoid(float x) { return 1.0f / (1.0f + op_exp(-x)); }
static inline float op_erf(float x) {
  float a = std::fabs(x);
  float t = 1.0f / (1.0f + 0.3275911f * a);
  float poly = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f +
               t * (-1.453152027f + t * 1.061405429f))));
  float s = x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x);
  return s * (1.0f - poly * op_exp(-a * a));
}
static inline float op_max(float a, float b) { return (a != a || a > b) ? a : b; }
static inline float op_min(float a, float b) { return (a != a || a < b) ? a : b; }
static inline float op_sign(float x) { return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : x); }
// bn_stats of n elements: (count, mean, variance) of the even and of the odd elements. With
// unit stride, 16 lanes accumulate (a lane's parity is its elements' parity), so the
// strided even/odd split costs no gathers.
static inline void op_bn_stats(const float* x, long n, long cs, float* y, long ocs) {
  float acc[16] = {0}, dev[16] = {0}, mean[16];
  const long full = cs == 1 ? n / 16 * 16 : 0;
  for (long c = 0; c < full; c += 16)
    for (int k = 0; k < 16; ++k) acc[k] += x[c + k];
  float sum[2] = {0.0f, 0.0f};
  for (int k = 0; k < 16; ++k) sum[k & 1] += acc[k];
  for (long c = full; c < n; ++c) sum[c & 1] += x[c * cs];
  const long count[2] = {(n + 1) / 2, n / 2};
  const float m[2] = {count[0] ? sum[0] / count[0] : 0.0f, count[1] ? sum[1] / count[1] : 0.0f};
  for (int k = 0; k < 16; ++k) mean[k] = m[k & 1];
  for (long c = 0; c < full; c += 16)
    for (int k = 0; k < 16; ++k) {
      const float d = x[c + k] - mean[k];
      dev[k] += d * d;
    }
  float var[2] = {0.0f, 0.0f};
  for (int k = 0; k < 16; ++k) var[k & 1] += dev[k];
  for (long c = full; c < n; ++c) {
    const float d = x[c * cs] - m[c & 1];
    var[c & 1] += d * d;
  }
  for (int part = 0; part < 2; ++part) {
    y[3 * part * ocs] = static_cast<float>(count[part]);
    y[(3 * part + 1) * ocs] = m[part];
    y[(3 * part + 2) * ocs] = count[part] ? var[part] / count[part] : 0.0f;
  }
}
"""

UNARY: dict[str, str] = {
    "exp": "op_exp({x})",
    "log": "std::log({x})",
    "sqrt": "std::sqrt({x})",
    "rsqrt": "(1.0f / std::sqrt({x}))",
    "reciprocal": "(1.0f / {x})",
    "square": "({x} * {x})",
    "abs": "std::fabs({x})",
    "negative": "(-{x})",
    "sin": "std::sin({x})",
    "cos": "std::cos({x})",
    "tan": "std::tan({x})",
    "tanh": "std::tanh({x})",
    "arctan": "std::atan({x})",
    "sigmoid": "op_sigmoid({x})",
    "relu": "op_max({x}, 0.0f)",
    "silu": "({x} * op_sigmoid({x}))",
    "gelu": "(0.5f * {x} * (1.0f + op_erf({x} * 0.70710678118654752f)))",
    "gelu_apprx_tanh": (
        "(0.5f * {x} * (1.0f + std::tanh(0.79788456080286536f * "
        "({x} + 0.044715f * {x} * {x} * {x}))))"
    ),
    "erf": "op_erf({x})",
    "sign": "op_sign({x})",
    "floor": "std::floor({x})",
    "ceil": "std::ceil({x})",
    "trunc": "std::trunc({x})",
    "copy": "{x}",
}

BINARY: dict[str, str] = {
    "add": "({a} + {b})",
    "subtract": "({a} - {b})",
    "multiply": "({a} * {b})",
    "divide": "({a} / {b})",
    "maximum": "op_max({a}, {b})",
    "minimum": "op_min({a}, {b})",
    "power": "std::pow({a}, {b})",
    "fmod": "std::fmod({a}, {b})",
}

# Reductions: (initial value, OpenMP reduction clause, combine statement over `acc`, `v`).
REDUCE: dict[str, tuple[str, str, str]] = {
    "add": ("0.0f", "+:acc", "acc += v;"),
    "maximum": ("-INFINITY", "max:acc", "acc = acc > v ? acc : v;"),
    "minimum": ("INFINITY", "min:acc", "acc = acc < v ? acc : v;"),
}


def literal(value: Any) -> str | None:
    """A float32 constant as C++, or None for values that are not real scalars."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        and not hasattr(value, "dtype")
    ):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    if math.isnan(number):
        return "NAN"
    if math.isinf(number):
        return "INFINITY" if number > 0 else "(-INFINITY)"
    import numpy as np

    return f"{float(np.float32(number))!r}f"


def reduction(op: str, element: str, free: int, into: str, nan_check: bool = True) -> list[str]:
    """Statements reducing `element` (an expression of `c`) over c < free into `into`."""
    init, clause, combine = REDUCE[op]
    lines = [f"float acc = {init};"]
    if op == "add" or not nan_check:
        lines.append(f"#pragma omp simd reduction({clause})")
        lines.append(f"for (long c = 0; c < {free}; ++c) {{ float v = {element}; {combine} }}")
    else:  # max/min propagate NaN as numpy does
        lines.append("int bad = 0;")
        lines.append(f"#pragma omp simd reduction({clause}) reduction(|:bad)")
        lines.append(
            f"for (long c = 0; c < {free}; ++c) {{ float v = {element}; bad |= v != v; {combine} }}"
        )
        lines.append("if (bad) acc = NAN;")
    lines.append(f"{into} = acc;")
    return lines
