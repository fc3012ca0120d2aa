// The one-pass SUM of two sources with streaming stores (streaming_sum.h), element by element,
// and the choice of the AVX2 version where the host has it.
#include "streaming_sum.h"

#include <cstdint>

#include "cpu_features.h"
#include "element_kernels.h"  // scalar_bf16_to_float, scalar_float_to_bf16: combine()'s own

#if defined(__x86_64__)
#include <emmintrin.h>  // SSE2: part of every x86-64 CPU, so no run-time check is needed
#endif

namespace nrt::dist {

#if defined(__x86_64__)
// streaming_sum.avx2.cpp: add_streaming_bf16's vector loop.
void add_streaming_bf16_avx2(uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t n,
                             uint16_t* cached);
#endif

namespace {

#if defined(__x86_64__)
// Plain stores until dst reaches a 64-byte boundary, so the vector loop writes whole lines.
bool on_line(const void* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }
#endif

}  // namespace

void add_streaming(float* dst, const float* a, const float* b, size_t count, float* cached) {
  size_t i = 0;
  auto scalar = [&](size_t end) {
    for (; i < end; ++i) {
      const float sum = a[i] + b[i];
      dst[i] = sum;
      if (cached != nullptr) cached[i] = sum;
    }
  };
#if defined(__x86_64__)
  while (i < count && !on_line(dst + i)) scalar(i + 1);  // floats are 4-byte aligned
  for (; i + 16 <= count; i += 16) {
    for (size_t k = i; k < i + 16; k += 4) {
      const __m128 sum = _mm_add_ps(_mm_loadu_ps(a + k), _mm_loadu_ps(b + k));
      _mm_stream_ps(dst + k, sum);
      if (cached != nullptr) _mm_storeu_ps(cached + k, sum);
    }
  }
  _mm_sfence();
#endif
  scalar(count);
}

bool bf16_sum_vectorised() {
#if defined(__x86_64__)
  static const bool avx2 = neuron::kernels::isa_level() >= neuron::kernels::IsaLevel::kAvx2;
  return avx2;
#else
  return false;
#endif
}

void add_streaming_bf16(uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t count,
                        uint16_t* cached) {
  size_t i = 0;
  auto scalar = [&](size_t end) {
    for (; i < end; ++i) {
      const uint16_t sum =
          scalar_float_to_bf16(scalar_bf16_to_float(a[i]) + scalar_bf16_to_float(b[i]));
      dst[i] = sum;
      if (cached != nullptr) cached[i] = sum;
    }
  };
#if defined(__x86_64__)
  while (i < count && !on_line(dst + i)) scalar(i + 1);  // bf16 is 2-byte aligned
  if (bf16_sum_vectorised()) {
    const size_t lines = (count - i) / 32 * 32;
    add_streaming_bf16_avx2(dst + i, a + i, b + i, lines, cached == nullptr ? nullptr : cached + i);
    i += lines;
  }
  _mm_sfence();
#endif
  scalar(count);
}

}  // namespace nrt::dist
