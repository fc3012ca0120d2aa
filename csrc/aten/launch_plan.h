// Which ops may launch asynchronously (async_launch.h), and what launching one needs to
// know, derived once per op from its schema and tags.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <atomic>
#include <string>
#include <vector>

namespace torchneuron {

// What launching an op asynchronously needs to know, derived once from its schema.
struct AsyncPlan {
  bool eligible = true;
  std::vector<bool> is_written;     // per argument: mutated in place (Tensor(a!))
  std::vector<bool> allows_host;    // per argument: CPU tensors accepted (index lists)
  std::vector<int> return_aliases;  // per return: index of the argument it returns, or -1
  std::string name;
  std::atomic<int> meta_failures{0};        // after a few, the op stays on the inline path
  std::atomic<bool> meta_disagreed{false};  // a result's shape was not the meta kernel's
  // The CPU kernel refuses tensor arguments of different dtypes, which the meta kernel
  // does not check: such calls run inline, so the error comes from the call.
  bool same_dtypes = false;
};

// After this many meta kernel failures an op stays on the inline path.
constexpr int kMetaFailuresBeforeGivingUp = 8;

// The op's plan (made on first use; shared by all threads).
AsyncPlan& plan_for(const c10::OperatorHandle& op);

// Whether the call's tensor arguments have different dtypes.
bool mixes_dtypes(const torch::jit::Stack& stack, size_t first);

}  // namespace torchneuron
