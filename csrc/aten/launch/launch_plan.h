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
  // The CPU kernel refuses its first `same_dtype_arguments` arguments (tensors) in
  // different dtypes, which the meta kernel does not check: such calls run inline, so the
  // error comes from the call. Others (saved float32 statistics) may differ.
  size_t same_dtype_arguments = 0;
  // An attention mask argument, which the CPU kernel takes in float32 or the first
  // argument's dtype, and with 2 or 4 dimensions, only (-1: none).
  int mask_argument = -1;
  // A seeded op whose only randomness is dropout: the index of its dropout_p argument, and
  // calls with a dropout_p other than 0 run inline (-1: not such an op).
  int dropout_argument = -1;
};

// After this many meta kernel failures an op stays on the inline path.
constexpr int kMetaFailuresBeforeGivingUp = 8;

// The op's plan (made on first use; shared by all threads).
AsyncPlan& plan_for(const c10::OperatorHandle& op);

// Whether a call (arguments on `stack` from index `first`) must run inline for its argument
// values: dtypes the CPU kernel refuses (so its error comes from the call), or dropout.
bool runs_inline_for_values(const AsyncPlan& plan, const torch::jit::Stack& stack, size_t first);

}  // namespace torchneuron
