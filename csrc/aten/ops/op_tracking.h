// Counts of the ops that ran on each path: every op that runs on a neuron device is
// "executed"; an op whose results had to be copied through separate host memory is also a
// "fallback"; an op that ran inline while launched work was pending, and so waited for it,
// is "synchronizing" (it stops Python from running ahead of the device). Counters are cheap
// to bump from the dispatch hot path.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>

namespace torchneuron {

struct OpCounter {
  std::string name;
  std::atomic<uint64_t> executed{0};
  std::atomic<uint64_t> fallback{0};
  std::atomic<uint64_t> synchronizing{0};
};

// Creates (or finds) the counter of an op keyed by a stable address.
OpCounter& op_counter(const void* key, const std::string& name);
// For kernels we register ourselves: a counter by name (call once, keep the reference).
OpCounter& op_counter_named(const std::string& name);

std::map<std::string, uint64_t> executed_ops();
std::map<std::string, uint64_t> fallback_ops();
std::map<std::string, uint64_t> synchronizing_ops();
void clear_op_tracking();

}  // namespace torchneuron
