// exp(x) over GCC/Clang vector types, for kernels compiled once per instruction set.
//
// The anonymous namespace is deliberate: each per-instruction-set file gets its own copy,
// so no weak template instance compiled with AVX-512 flags can be shared with a baseline
// file and run on a host without AVX-512.
#pragma once

namespace neuron::kernels {
namespace {  // NOLINT(google-build-namespaces): one copy per instruction-set file (above)

// exp(x) to about 1 ulp (Cephes' expf polynomial on x - n ln2, scaled by 2^n). Below
// -87.3 the result is 0 (no subnormals): masked (-inf) softmax entries come out exactly 0.
// VecF: a vector of float; VecI: the vector of int32_t of the same width.
template <class VecF, class VecI>
inline VecF exp_cephes(VecF x) {
  const VecF low = VecF{} - 87.33654f;
  const VecF high = VecF{} + 88.0f;
  const VecI underflow = x < low;
  x = x < low ? low : x;
  x = x > high ? high : x;
  const VecF n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  // round(x / ln2)
  VecF r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  VecF p = VecF{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const VecF y = p * (r * r) + r + 1.0f;
  const VecI scale_bits = (__builtin_convertvector(n, VecI) + 127) << 23;
  const VecF result = y * (VecF)scale_bits;
  return underflow ? VecF{} : result;
}

}  // namespace
}  // namespace neuron::kernels
