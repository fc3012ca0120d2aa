// What an op's schema says about its tensor arguments, for the plans that the host-kernel
// executor (host_kernel_executor.cpp) and asynchronous launches (launch_plan.cpp) derive
// once per op.
#pragma once

#include <ATen/core/function_schema.h>

#include <vector>

namespace torchneuron {

struct SchemaArguments {
  std::vector<bool> is_written;     // per argument: mutated in place (Tensor(a!))
  std::vector<bool> allows_host;    // per argument: CPU tensors accepted (Tensor?[] index lists)
  std::vector<int> return_aliases;  // per return: index of the written argument it is, or -1
};

SchemaArguments schema_arguments(const c10::FunctionSchema& schema);

}  // namespace torchneuron
