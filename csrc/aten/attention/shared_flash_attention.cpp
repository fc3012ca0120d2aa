// PyTorch's CPU flash attention on the neuron device, split over the task board.
//
// Where the board covers the host's CPUs the stream's worker runs PyTorch's kernels on one
// thread (worker_intra_op_threads), so attention (about half of a diffusion transformer's
// step) ran on one core while a waiting caller's core sat idle. PyTorch's CPU flash kernel
// computes every (batch, head) pair alone, forward and backward, so the problem is split in
// two tasks along the batch (along heads for a batch of 1), each a one-thread CPU call on
// its part, and the parts' results are copied into whole outputs laid out as the kernel lays
// them out: the CPU kernel's results bit for bit, whoever runs which task, in any launch
// mode. Dropout, small problems, a thread without the board and shapes the split does not
// cover run the kernel whole, as before.
#include "attention/shared_flash_attention.h"

#include <ATen/Functions.h>
#include <ATen/Operators.h>

#include <algorithm>
#include <atomic>
#include <numeric>
#include <vector>

#include "host_kernels/host_kernel_executor.h"
#include "native/aten_parallel.h"
#include "native/native_kernel_switch.h"
#include "ops/op_tracking.h"
#include "task_board.h"

namespace torchneuron {
namespace {

using Forward = at::_ops::_scaled_dot_product_flash_attention_for_cpu;
using Backward = at::_ops::_scaled_dot_product_flash_attention_for_cpu_backward;

constexpr int64_t kTasks = 2;
// Smaller problems (batch × heads × query rows × key rows × head size) stay one call: a
// chosen bound (4x the native GEMM's serial bound), not a measured crossover.
constexpr int64_t kSplitFromMultiplyAdds = int64_t{1} << 19;

// The index in `t` of dimension `dim` of the 4-D operands when `t` broadcasts against them
// (aligned on the right), or -1 if it has none.
int64_t broadcast_dim(const at::Tensor& t, int64_t dim) { return dim - (4 - t.dim()); }

// The dimension the tasks split (0: batch, 1: heads), or nullopt.
std::optional<int64_t> split_dim(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const std::optional<at::Tensor>& mask, double dropout_p) {
  if (dropout_p != 0.0 || !native_kernels_enabled()) return std::nullopt;
  for (const at::Tensor* t : {&q, &k, &v}) {
    if (t->dim() != 4 || t->device() != q.device() || t->layout() != at::kStrided) {
      return std::nullopt;
    }
  }
  const bool masked = mask.has_value() && mask->defined();
  if (masked && (mask->dim() > 4 || mask->device() != q.device())) return std::nullopt;
  if (q.size(0) * q.size(1) * q.size(2) * k.size(2) * q.size(3) < kSplitFromMultiplyAdds) {
    return std::nullopt;
  }
  if (at::get_num_threads() > kBoardThreads || !nrt::TaskBoard::instance().shares_here()) {
    return std::nullopt;
  }
  for (int64_t dim : {0, 1}) {
    const int64_t size = q.size(dim);
    if (size < kTasks || k.size(dim) != size || v.size(dim) != size) continue;
    const int64_t own = masked ? broadcast_dim(*mask, dim) : -1;
    // a mask that does not broadcast stays with the whole kernel, whose error it is
    if (own >= 0 && mask->size(own) != 1 && mask->size(own) != size) return std::nullopt;
    return dim;
  }
  return std::nullopt;
}

// Task `task`'s part of dimension `own` of `t` (whole where it has none or it is 1).
at::Tensor part(const at::Tensor& t, int64_t own, int64_t task) {
  if (!t.defined() || own < 0 || t.size(own) == 1) return t;
  const int64_t size = t.size(own);
  const int64_t begin = size * task / kTasks;
  return t.narrow(own, begin, size * (task + 1) / kTasks - begin);
}

std::optional<at::Tensor> mask_part(const std::optional<at::Tensor>& mask, int64_t dim,
                                    int64_t task) {
  if (!mask.has_value() || !mask->defined()) return mask;
  return part(*mask, broadcast_dim(*mask, dim), task);
}

// An empty tensor of `sizes` whose dimensions lie in memory in the order of `like`'s.
at::Tensor empty_laid_out_as(const at::Tensor& like, std::vector<int64_t> sizes) {
  std::vector<int64_t> order(like.dim());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return like.stride(a) > like.stride(b); });
  std::vector<int64_t> permuted, inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) {
    permuted.push_back(sizes[order[i]]);
    inverse[order[i]] = static_cast<int64_t>(i);
  }
  return at::empty(permuted, like.options()).permute(inverse);
}

// Runs task(t) -> results for both tasks over the board (run_cpu_kernel_tasks), and joins each
// result of the tasks along dimension `dim` into one tensor.
template <class Task>
std::vector<at::Tensor> run_split(int64_t dim, int64_t size, const Task& task) {
  static std::atomic<uint64_t>& splits = native_kernel_counter("flash_attention_split");
  std::vector<std::vector<at::Tensor>> results(kTasks);
  run_cpu_kernel_tasks(kTasks, [&](int64_t t) { results[t] = task(t); });
  std::vector<at::Tensor> joined;
  for (size_t i = 0; i < results[0].size(); ++i) {
    std::vector<int64_t> sizes = results[0][i].sizes().vec();
    sizes[dim] = size;
    at::Tensor whole = empty_laid_out_as(results[0][i], sizes);
    for (int64_t t = 0; t < kTasks; ++t) part(whole, dim, t).copy_(results[t][i]);
    joined.push_back(std::move(whole));
  }
  splits.fetch_add(1, std::memory_order_relaxed);
  return joined;
}

std::optional<at::Tensor> host_optional(HostKernelCall& call, const std::optional<at::Tensor>& t) {
  if (!t.has_value() || !t->defined()) return t;
  return call.to_host(*t);
}

const c10::DispatchKeySet kCpu(c10::DispatchKey::CPU);

}  // namespace

std::optional<std::tuple<at::Tensor, at::Tensor>> shared_flash_attention(
    const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, double dropout_p,
    bool is_causal, const std::optional<at::Tensor>& attn_mask, std::optional<double> scale) {
  const auto dim = split_dim(query, key, value, attn_mask, dropout_p);
  if (!dim) return std::nullopt;
  static OpCounter& counter = op_counter_named(Forward::name);
  HostKernelCall call(query.device().index(), &counter);
  const at::Tensor q = call.to_host(query), k = call.to_host(key), v = call.to_host(value);
  const std::optional<at::Tensor> mask = host_optional(call, attn_mask);
  std::vector<at::Tensor> results = call.run(Forward::name, [&] {
    return run_split(*dim, query.size(*dim), [&](int64_t t) {
      auto [out, lse] =
          Forward::redispatch(kCpu, part(q, *dim, t), part(k, *dim, t), part(v, *dim, t), dropout_p,
                              is_causal, mask_part(mask, *dim, t), scale);
      return std::vector<at::Tensor>{out, lse};
    });
  });
  counter.executed.fetch_add(1, std::memory_order_relaxed);
  return std::make_tuple(call.adopt(std::move(results[0])), call.adopt(std::move(results[1])));
}

std::optional<std::tuple<at::Tensor, at::Tensor, at::Tensor>> shared_flash_attention_backward(
    const at::Tensor& grad_out, const at::Tensor& query, const at::Tensor& key,
    const at::Tensor& value, const at::Tensor& out, const at::Tensor& logsumexp, double dropout_p,
    bool is_causal, const std::optional<at::Tensor>& attn_mask, std::optional<double> scale) {
  const auto dim = split_dim(query, key, value, attn_mask, dropout_p);
  if (!dim || grad_out.dim() != 4 || out.dim() != 4 || logsumexp.dim() != 3) return std::nullopt;
  static OpCounter& counter = op_counter_named(Backward::name);
  HostKernelCall call(query.device().index(), &counter);
  const at::Tensor dout = call.to_host(grad_out), q = call.to_host(query), k = call.to_host(key),
                   v = call.to_host(value), o = call.to_host(out), lse = call.to_host(logsumexp);
  const std::optional<at::Tensor> mask = host_optional(call, attn_mask);
  std::vector<at::Tensor> grads = call.run(Backward::name, [&] {
    return run_split(*dim, query.size(*dim), [&](int64_t t) {
      auto [dq, dk, dv] =
          Backward::redispatch(kCpu, part(dout, *dim, t), part(q, *dim, t), part(k, *dim, t),
                               part(v, *dim, t), part(o, *dim, t), part(lse, *dim, t), dropout_p,
                               is_causal, mask_part(mask, *dim, t), scale);
      return std::vector<at::Tensor>{dq, dk, dv};
    });
  });
  counter.executed.fetch_add(1, std::memory_order_relaxed);
  return std::make_tuple(call.adopt(std::move(grads[0])), call.adopt(std::move(grads[1])),
                         call.adopt(std::move(grads[2])));
}

}  // namespace torchneuron
