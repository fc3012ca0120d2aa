// sdpa_decode(): argument checks, the run-time choice of instruction set, the split of work
// among threads and the per-thread scratch (sdpa_decode_impl.h is the algorithm).
#include "sdpa_decode.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "sdpa_decode_levels.h"

namespace neuron::kernels {
namespace detail {

int64_t sdpa_decode_scratch_floats(const SdpaDecodeProblem& problem, int64_t rows) {
  const int64_t padded = (problem.head_dim + 15) / 16 * 16;
  return std::min<int64_t>(rows, 64) * (problem.kv_len + 2 * padded);
}

}  // namespace detail

namespace {

detail::SdpaDecodeRows rows_for(IsaLevel level) {
  switch (std::min(level, host_isa_level())) {
#if defined(__x86_64__) || defined(_M_X64)
    case IsaLevel::kAmxBf16:
    case IsaLevel::kAvx512Bf16:
      return detail::sdpa_decode_rows_avx512_bf16;
    case IsaLevel::kAvx512:
      return detail::sdpa_decode_rows_avx512;
    case IsaLevel::kAvx2:
      return detail::sdpa_decode_rows_avx2;
#endif
    default:
      return detail::sdpa_decode_rows_baseline;
  }
}

void check(const SdpaDecodeProblem& p) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("sdpa_decode: " + what); };
  if (p.batch < 0 || p.q_heads < 0 || p.kv_heads < 0 || p.q_len < 0 || p.kv_len < 0 ||
      p.head_dim < 0) {
    fail("negative size");
  }
  if (p.batch == 0 || p.q_heads == 0 || p.q_len == 0 || p.head_dim == 0) return;
  if (p.kv_heads <= 0 || p.q_heads % p.kv_heads != 0) {
    fail("query heads (" + std::to_string(p.q_heads) + ") are not a multiple of kv heads (" +
         std::to_string(p.kv_heads) + ")");
  }
  if (p.q == nullptr || p.out == nullptr) fail("no query or output");
  if (p.kv_len > 0 && (p.k == nullptr || p.v == nullptr)) fail("no key or value");
}

}  // namespace

void sdpa_decode(const SdpaDecodeProblem& problem, const ParallelFor& parallel, IsaLevel level) {
  check(problem);
  if (problem.batch == 0 || problem.q_heads == 0 || problem.q_len == 0 || problem.head_dim == 0) {
    return;
  }
  const detail::SdpaDecodeRows rows_of = rows_for(level);
  // Work unit: a chunk of one (batch, kv head) group's rows. Whole groups read their K/V
  // once; groups are split only when there are fewer of them than threads.
  const int64_t groups = problem.batch * problem.kv_heads;
  const int64_t rows = problem.q_heads / problem.kv_heads * problem.q_len;
  const int64_t threads = std::max(1, parallel.threads);
  const int64_t chunks = std::clamp<int64_t>((threads + groups - 1) / groups, 1, rows);
  const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  const int64_t scratch_floats = detail::sdpa_decode_scratch_floats(problem, rows_per_chunk);
  auto body = [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scratch;
    if (static_cast<int64_t>(scratch.size()) < scratch_floats) {
      scratch.resize(static_cast<size_t>(scratch_floats));
    }
    for (int64_t task = begin; task < end; ++task) {
      const int64_t group = task / chunks, chunk = task % chunks;
      const int64_t first = chunk * rows_per_chunk;
      const int64_t last = std::min(rows, first + rows_per_chunk);
      if (first < last) rows_of(problem, group, first, last, scratch.data());
    }
  };
  parallel.run(groups * chunks, body);
}

void sdpa_decode(const SdpaDecodeProblem& problem, const ParallelFor& parallel) {
  sdpa_decode(problem, parallel, isa_level());
}

}  // namespace neuron::kernels
