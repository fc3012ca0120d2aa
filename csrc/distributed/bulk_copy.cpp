// The staging copies of the collectives (bulk_copy.h): streaming stores for large copies out
// of another core's cache lines, memcpy for small ones.
#include "bulk_copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>  // SSE2: part of every x86-64 CPU, so no run-time check is needed
#endif

namespace nrt::dist {
namespace {

#if defined(__x86_64__)
constexpr size_t kLine = 64;

size_t misalignment(const void* p) { return reinterpret_cast<uintptr_t>(p) % kLine; }

// Whole lines from s to d (d 64-byte aligned, n a multiple of 64): with streaming stores
// (kStream) or ordinary ones, each line of s kPrefetchBytes ahead prefetched (kPrefetch),
// and when `twice` is set also with ordinary stores to `twice`.
template <bool kPrefetch, bool kStream>
void copy_lines(char* d, const char* s, size_t n, char* twice) {
  if (kPrefetch) {
    for (size_t i = 0; i < std::min(n, kPrefetchBytes); i += kLine)
      _mm_prefetch(s + i, _MM_HINT_T0);
  }
  for (size_t i = 0; i < n; i += kLine) {
    if (kPrefetch) _mm_prefetch(s + i + kPrefetchBytes, _MM_HINT_T0);
    __m128i x[4];
    for (int k = 0; k < 4; ++k) x[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i) + k);
    for (int k = 0; k < 4; ++k) {
      auto* line = reinterpret_cast<__m128i*>(d + i) + k;
      if (kStream) {
        _mm_stream_si128(line, x[k]);
      } else {
        _mm_store_si128(line, x[k]);
      }
      if (twice != nullptr) _mm_storeu_si128(reinterpret_cast<__m128i*>(twice + i) + k, x[k]);
    }
  }
}

// Copies the head before dst's first line boundary and the tail after its last with
// memcpy, and the lines between with `lines` (a copy_lines instance).
template <class Lines>
void copy_aligned(char* d, const char* s, size_t bytes, char* twice, Lines lines) {
  const size_t head = std::min(bytes, (kLine - misalignment(d)) % kLine);
  const size_t body = (bytes - head) / kLine * kLine;
  const size_t tail = bytes - head - body;
  std::memcpy(d, s, head);
  if (twice != nullptr) std::memcpy(twice, s, head);
  lines(d + head, s + head, body, twice == nullptr ? nullptr : twice + head);
  std::memcpy(d + head + body, s + head + body, tail);
  if (twice != nullptr) std::memcpy(twice + head + body, s + head + body, tail);
}
#endif

}  // namespace

void copy_from_staging(void* dst, const void* src, size_t bytes, bool stream) {
#if defined(__x86_64__)
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  if (stream) {
    copy_aligned(d, s, bytes, nullptr, copy_lines<true, true>);
    _mm_sfence();
  } else {
    copy_aligned(d, s, bytes, nullptr, copy_lines<true, false>);
  }
#else
  (void)stream;
  std::memcpy(dst, src, bytes);
#endif
}

void copy_twice(void* staging, void* out, const void* src, size_t bytes, bool stream) {
#if defined(__x86_64__)
  if (stream) {
    copy_aligned(static_cast<char*>(out), static_cast<const char*>(src), bytes,
                 static_cast<char*>(staging), copy_lines<false, true>);
    _mm_sfence();
    return;
  }
#endif
  std::memcpy(staging, src, bytes);
  std::memcpy(out, staging, bytes);  // from the copy just made: in cache
}

}  // namespace nrt::dist
