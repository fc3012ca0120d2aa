// isin (csrc/kernels/membership.h) against a std::set reference: test-value counts on both
// sides of the switch from compares to a binary search, duplicates and negative values,
// both integer widths, invert.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "membership.h"

namespace nk = neuron::kernels;

namespace {

template <class T>
void check(int64_t count, bool invert) {
  std::mt19937 rng(static_cast<unsigned>(count * 2 + invert));
  std::uniform_int_distribution<int> value(-40, 200);
  std::vector<T> elements(501), tests(static_cast<size_t>(count));
  for (auto& e : elements) e = static_cast<T>(value(rng));
  for (auto& t : tests) t = static_cast<T>(value(rng));
  const std::set<T> set(tests.begin(), tests.end());
  std::vector<char> out(elements.size(), 2);
  nk::isin(elements.data(), static_cast<int64_t>(elements.size()), tests.data(), count, invert,
           reinterpret_cast<bool*>(out.data()));
  for (size_t i = 0; i < elements.size(); ++i) {
    const bool expected = (set.count(elements[i]) != 0) != invert;
    ASSERT_EQ(out[i], expected ? 1 : 0) << "count " << count << " element " << i;
  }
}

}  // namespace

TEST(Membership, MatchesASetForEveryTestCount) {
  for (int64_t count : {0, 1, 2, 16, 17, 64, 300}) {
    for (bool invert : {false, true}) {
      check<int64_t>(count, invert);
      check<int32_t>(count, invert);
    }
  }
}
