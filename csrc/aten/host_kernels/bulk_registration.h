// Registers one boxed kernel for every aten op that a predicate selects, under one
// dispatch key: how the executors send whole families of ops to PyTorch's CPU kernels.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <functional>
#include <memory>
#include <string>

namespace torchneuron {

// The registrations live as long as the returned library; `wanted` sees each aten op that
// has no kernel for `key` yet.
template <void (*kernel)(const c10::OperatorHandle&, torch::jit::Stack*)>
std::unique_ptr<torch::Library> register_for_aten_ops(
    c10::DispatchKey key, const std::function<bool(const c10::OperatorHandle&)>& wanted) {
  auto library =
      std::make_unique<torch::Library>(torch::Library::IMPL, "aten", key, __FILE__, __LINE__);
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto op = dispatcher.findOp(name);
    if (!op.has_value() || op->hasKernelForDispatchKey(key) || !wanted(*op)) continue;
    std::string qualified = name.name.substr(6);
    if (!name.overload_name.empty()) qualified += "." + name.overload_name;
    library->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<kernel>());
  }
  return library;
}

}  // namespace torchneuron
