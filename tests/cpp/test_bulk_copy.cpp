// The collectives' copies (csrc/distributed/bulk_copy.h) against the source bytes, for every
// alignment of source and destination within a cache line and sizes around the line and
// prefetch boundaries: every byte arrives, and no byte outside the destination changes.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>

#include "bulk_copy.h"

namespace {

constexpr size_t kGuard = 128;
constexpr uint8_t kUntouched = 0xA5;

using Copy = std::function<void(void* dst, const void* src, size_t bytes)>;

// Copies `bytes` from src offset `so` to dst offset `doff` (within 64-byte aligned
// buffers) and checks the destination and the guard bytes around it.
void check(const Copy& copy, size_t bytes, size_t so, size_t doff, const std::string& what) {
  alignas(64) static uint8_t src[2 * kGuard + 8192 + 64];
  alignas(64) static uint8_t dst[2 * kGuard + 8192 + 64];
  for (size_t i = 0; i < sizeof src; ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  std::memset(dst, kUntouched, sizeof dst);
  copy(dst + kGuard + doff, src + kGuard + so, bytes);
  for (size_t i = 0; i < sizeof dst; ++i) {
    const bool inside = i >= kGuard + doff && i < kGuard + doff + bytes;
    const uint8_t want = inside ? src[i - doff + so] : kUntouched;
    ASSERT_EQ(dst[i], want) << what << ": " << bytes << " bytes, source offset " << so
                            << ", destination offset " << doff << ", byte " << i;
  }
}

void check_all(const Copy& copy, const std::string& what) {
  const size_t sizes[] = {0,   1,    15,   63,   64,   65,   127,  128, 200,
                          960, 1024, 2047, 2048, 2049, 4095, 4160, 8192};
  for (size_t bytes : sizes) {
    for (size_t so : {size_t{0}, size_t{1}, size_t{16}, size_t{37}, size_t{63}}) {
      for (size_t doff = 0; doff < 64; doff += 7) check(copy, bytes, so, doff, what);
    }
  }
}

}  // namespace

TEST(BulkCopy, CopyFromStagingMatchesSourceStreamedOrNot) {
  for (bool stream : {false, true}) {
    check_all([stream](void* d, const void* s,
                       size_t n) { nrt::dist::copy_from_staging(d, s, n, stream); },
              stream ? "copy_from_staging streamed" : "copy_from_staging");
  }
}

// Both destinations of copy_twice: the staging copy, then the output part.
TEST(BulkCopy, CopyTwiceFillsStagingAndOutput) {
  for (bool stream : {false, true}) {
    alignas(64) static uint8_t staging[8192 + 128];
    for (size_t offset : {size_t{0}, size_t{9}}) {
      check_all(
          [&](void* d, const void* s, size_t n) {
            nrt::dist::copy_twice(staging + offset, d, s, n, stream);
            ASSERT_EQ(std::memcmp(staging + offset, s, n), 0) << "staging copy of " << n;
          },
          std::string("copy_twice") + (stream ? " streamed" : "") + " staging offset " +
              std::to_string(offset));
    }
  }
}
