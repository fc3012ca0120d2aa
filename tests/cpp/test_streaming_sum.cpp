// The one-pass sums of two-rank collectives (csrc/distributed/streaming_sum.h) against the
// element-wise sums and against combine(), for every offset of the destination within a
// cache line and of the operands, with the bytes around the destination untouched.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "element_ops.h"
#include "streaming_sum.h"

// add_streaming against the element-wise sums, for every float offset of the destination
// within a line and of the operands, with the bytes around the destination untouched; with
// and without the second, cached destination.
TEST(StreamingSum, Float32MatchesElementwiseSums) {
  alignas(64) static float a[2200], b[2200], dst[2400], cached[2400];
  for (size_t i = 0; i < 2200; ++i) {
    a[i] = 0.37f * static_cast<float>(i) - 100.0f;
    b[i] = 1.0f / static_cast<float>(i + 3);
  }
  for (bool twice : {false, true}) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{100},
                         size_t{2048}, size_t{2049}}) {
      for (size_t so : {size_t{0}, size_t{3}}) {
        for (size_t doff = 0; doff < 16; doff += 5) {
          for (float& x : dst) x = -7.0f;
          for (float& x : cached) x = -7.0f;
          nrt::dist::add_streaming(dst + 16 + doff, a + so, b + so, count,
                                   twice ? cached + 5 : nullptr);
          for (size_t i = 0; i < 2400; ++i) {
            const bool inside = i >= 16 + doff && i < 16 + doff + count;
            const float want = inside ? a[so + i - 16 - doff] + b[so + i - 16 - doff] : -7.0f;
            ASSERT_EQ(dst[i], want) << count << " floats, operand offset " << so
                                    << ", destination offset " << doff << ", float " << i;
            const bool in_cached = twice && i >= 5 && i < 5 + count;
            const float want_cached = in_cached ? a[so + i - 5] + b[so + i - 5] : -7.0f;
            ASSERT_EQ(cached[i], want_cached) << "cached copy, " << count << " floats, float " << i;
          }
        }
      }
    }
  }
}

namespace {

bool is_nan_bf16(uint16_t v) { return (v & 0x7F80) == 0x7F80 && (v & 0x7F) != 0; }

// The same bits, or both NaN: of two NaN operands the hardware keeps the first's payload,
// and which one is first in combine()'s vectorised add is the compiler's choice.
bool same_sum(uint16_t got, uint16_t want) {
  return got == want || (is_nan_bf16(got) && is_nan_bf16(want));
}

}  // namespace

// bf16 bit patterns of every kind (normal, subnormal, zero, infinite, NaN, ties that round
// to even both ways) summed, against combine()'s bits at the host's ISA level.
TEST(StreamingSum, BFloat16MatchesCombine) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> bits(0, 0xFFFF);
  const uint16_t special[] = {0x0000, 0x8000, 0x0001, 0x807F, 0x7F80, 0xFF80, 0x7FC0,
                              0x7F81, 0xFFFF, 0x3F80, 0x3F81, 0xBF80, 0x4000, 0x0080};
  std::vector<uint16_t> a(4200), b(4200);
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = i % 5 == 0 ? special[i % 14] : static_cast<uint16_t>(bits(rng));
    b[i] = i % 7 == 0 ? special[(i / 7) % 14] : static_cast<uint16_t>(bits(rng));
  }
  alignas(64) static uint16_t dst[4400], cached[4400], want[4400];
  for (bool twice : {false, true}) {
    for (size_t count :
         {size_t{0}, size_t{1}, size_t{31}, size_t{32}, size_t{33}, size_t{4096}, size_t{4100}}) {
      for (size_t doff = 0; doff < 32; doff += 7) {
        for (size_t so : {size_t{0}, size_t{5}}) {
          std::memset(dst, 0xAB, sizeof dst);
          std::memset(cached, 0xAB, sizeof cached);
          std::memset(want, 0xAB, sizeof want);
          nrt::dist::combine(want + 32 + doff, a.data() + so, b.data() + so, count,
                             nrt::dist::ElementType::kBFloat16, nrt::dist::ReduceOp::kSum);
          nrt::dist::add_streaming_bf16(dst + 32 + doff, a.data() + so, b.data() + so, count,
                                        twice ? cached + 32 + doff : nullptr);
          for (size_t i = 0; i < 4400; ++i) {
            ASSERT_TRUE(same_sum(dst[i], want[i]))
                << count << " elements, destination offset " << doff << ", operand offset " << so
                << ", element " << i << ": " << dst[i] << " against " << want[i];
            if (twice) {
              ASSERT_TRUE(same_sum(cached[i], want[i])) << "cached copy, element " << i;
            }
          }
        }
      }
    }
  }
}
