// Integer membership, torch.isin's kernel (membership.h): a compare per test value for few
// values, a search among them sorted for more.
#include "membership.h"

#include <algorithm>
#include <vector>

namespace neuron::kernels {
namespace {

// Up to this many test values, each element is compared with all of them (a loop the
// compiler vectorises); beyond, it is searched among them sorted.
constexpr int64_t kMaxLinearTests = 16;

template <class T>
void isin_typed(const T* elements, int64_t n, const T* tests, int64_t t, bool invert, bool* out) {
  if (t <= kMaxLinearTests) {
    for (int64_t i = 0; i < n; ++i) {
      const T e = elements[i];
      bool hit = false;
      for (int64_t j = 0; j < t; ++j) hit |= e == tests[j];
      out[i] = hit != invert;
    }
    return;
  }
  std::vector<T> sorted(tests, tests + t);
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < n; ++i) {
    out[i] = std::binary_search(sorted.begin(), sorted.end(), elements[i]) != invert;
  }
}

}  // namespace

void isin(const int64_t* elements, int64_t n, const int64_t* tests, int64_t t, bool invert,
          bool* out) {
  isin_typed(elements, n, tests, t, invert, out);
}

void isin(const int32_t* elements, int64_t n, const int32_t* tests, int64_t t, bool invert,
          bool* out) {
  isin_typed(elements, n, tests, t, invert, out);
}

}  // namespace neuron::kernels
