// Which kernel computes a float32 product on this host: the native GEMM or PyTorch's CPU
// library kernel (MKL). Neither wins on every host: per CPU-second the native GEMM was 1.22x
// MKL on an AMD AVX-512 host, 0.78-1.1x on an AVX2 host, 0.64x at M = 512 on an Intel Ice
// Lake host, where MKL reaches 80% of one core's peak (benchmarks/gemm.py). So the first
// product of each shape class times both kernels on its own operands and the class keeps the
// faster one for the rest of the process, as cuDNN's benchmark mode does for convolutions.
// TORCHNEURON_GEMM_ROUTE=native|library pins the choice (results then do not depend on
// timing); `measure` is the default.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace torchneuron {

enum class GemmRoute { kNative, kLibrary };

// Products of one class share a route: dimensions rounded down to powers of two, and which
// operands are read transposed (the kernels' speed depends on both).
struct ProductClass {
  int m_log2 = 0;
  int n_log2 = 0;
  int k_log2 = 0;
  bool a_transposed = false;
  bool b_transposed = false;

  bool operator<(const ProductClass& other) const;
};

ProductClass product_class(int64_t m, int64_t n, int64_t k, bool a_transposed, bool b_transposed);

// Products below this many multiply-adds are not measured (they take the native GEMM): the
// timing would cost more than the choice could save.
constexpr int64_t kRoutedAboveMultiplyAdds = int64_t{1} << 24;

// The route of `cls`: pinned by the environment, decided before, or decided now by timing
// `run_native` and `run_library` (each computes the same product into scratch memory).
GemmRoute gemm_route(const ProductClass& cls, const std::function<void()>& run_native,
                     const std::function<void()>& run_library);

// The classes decided in this process, as "m,n,k,at,bt:route:native_s,library_s" lines
// (tests, benchmarks).
std::vector<std::string> decided_gemm_routes();

}  // namespace torchneuron
