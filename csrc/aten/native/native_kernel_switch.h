// Whether ops use our own kernels (csrc/kernels) where they have one, and how often each
// ran. TORCHNEURON_NATIVE_KERNELS=0 sends every op back to PyTorch's CPU kernels (for
// bitwise-CPU numerics, or to rule our kernels out); read once per process.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <string>

namespace torchneuron {

bool native_kernels_enabled();

// A counter of one native kernel's runs (call once, keep the reference).
std::atomic<uint64_t>& native_kernel_counter(const std::string& name);

// Runs per native kernel since load (for tests: proof that a kernel ran).
std::map<std::string, uint64_t> native_kernel_runs();

}  // namespace torchneuron
