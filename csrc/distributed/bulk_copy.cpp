#include "bulk_copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>  // SSE2: part of every x86-64 CPU, so no run-time check is needed
#endif

namespace nrt::dist {

void copy_streaming(void* dst, const void* src, size_t bytes) {
#if defined(__x86_64__)
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  // Cached stores up to the first 64-byte boundary of dst, then whole lines.
  const size_t head = std::min(bytes, (64 - reinterpret_cast<uintptr_t>(d) % 64) % 64);
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  const size_t lines = bytes / 64;
  for (size_t i = 0; i < lines; ++i, d += 64, s += 64) {
    const __m128i x0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i x1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    const __m128i x2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    const __m128i x3 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), x0);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), x1);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), x2);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), x3);
  }
  std::memcpy(d, s, bytes % 64);
  _mm_sfence();
#else
  std::memcpy(dst, src, bytes);
#endif
}

void copy_twice(void* cached, void* out, const void* src, size_t bytes, bool stream) {
#if defined(__x86_64__)
  if (stream) {
    auto* c = static_cast<char*>(cached);
    auto* d = static_cast<char*>(out);
    const auto* s = static_cast<const char*>(src);
    const size_t head = std::min(bytes, (64 - reinterpret_cast<uintptr_t>(d) % 64) % 64);
    std::memcpy(c, s, head);
    std::memcpy(d, s, head);
    c += head;
    d += head;
    s += head;
    bytes -= head;
    const size_t lines = bytes / 64;
    for (size_t i = 0; i < lines; ++i, c += 64, d += 64, s += 64) {
      for (int k = 0; k < 64; k += 16) {
        const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + k));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(c + k), x);
        _mm_stream_si128(reinterpret_cast<__m128i*>(d + k), x);
      }
    }
    std::memcpy(c, s, bytes % 64);
    std::memcpy(d, s, bytes % 64);
    _mm_sfence();
    return;
  }
#endif
  std::memcpy(cached, src, bytes);
  if (stream) {
    copy_streaming(out, cached, bytes);
  } else {
    std::memcpy(out, cached, bytes);  // from the copy just made: in cache
  }
}

}  // namespace nrt::dist
