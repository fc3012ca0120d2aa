// The boxed host-kernel executor (host_kernel_executor.cpp) as a callable, for kernels of
// our own that hand the cases they do not cover back to PyTorch's CPU kernels.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

namespace torchneuron {

void run_on_host_kernels_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace torchneuron
