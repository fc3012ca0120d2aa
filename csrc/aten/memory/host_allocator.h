// Pinned (page-locked) host memory for faster, asynchronous host-to-device copies, as
// tensor.pin_memory() gives on CUDA. Blocks are cached by size and locked with mlock where
// the system allows it.
#pragma once

#include <ATen/core/CachingHostAllocator.h>

namespace torchneuron {

at::HostAllocator& host_allocator();
bool is_pinned_host_pointer(const void* ptr);

}  // namespace torchneuron
