// Runs every ATen op that has no dedicated neuron kernel on the host kernels of PyTorch's
// CPU backend, directly over device memory (zero-copy): neuron arguments are passed as CPU
// aliases of the same bytes, allocations made by the kernel are served from the op's
// device (allocation_redirect.h), and results are adopted as neuron tensors without a copy.
// A result whose bytes did not come from device memory is copied in and counted as a
// fallback (op_tracking.h).
#include "host_kernels/host_kernel_executor.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/op_registration/op_registration.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "device/device_placement.h"
#include "device/device_state.h"
#include "device/generator.h"
#include "host_kernels/bulk_registration.h"
#include "host_kernels/schema_arguments.h"
#include "launch/async_launch.h"
#include "memory/allocation_redirect.h"
#include "memory/caching_allocator.h"
#include "memory/host_alias.h"
#include "native/aten_parallel.h"
#include "op_registrations.h"
#include "ops/op_tracking.h"
#include "profiler/device_activity.h"

namespace torchneuron {

int host_kernel_threads() {
  const int threads = at::get_num_threads();
  return async_launches() ? worker_intra_op_threads(threads) : threads;
}

InlineKernelThreads::InlineKernelThreads() {
#ifdef _OPENMP
  if (on_stream_worker() || host_kernel_threads() != 1) return;
  const int threads = omp_get_max_threads();
  if (threads == 1 || omp_in_parallel()) return;
  omp_set_num_threads(1);
  saved_ = threads;
#endif
}

InlineKernelThreads::~InlineKernelThreads() {
#ifdef _OPENMP
  if (saved_ != 0) omp_set_num_threads(saved_);
#endif
}

namespace {

// What the executor needs to know about an op, derived once from its schema.
struct OpPlan {
  OpCounter* counter = nullptr;
  std::vector<bool> is_generator;   // per argument
  std::vector<bool> allows_host;    // per argument: CPU tensors accepted (indices)
  std::vector<bool> is_written;     // per argument: mutated in place (Tensor(a!))
  std::vector<int> return_aliases;  // per return: index of the argument it returns, or -1
  bool returns_arguments = false;   // any return_aliases[j] >= 0
  std::string name;
};

bool is_generator_type(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::GeneratorType) return true;
  if (auto optional = type->cast<c10::OptionalType>()) {
    return optional->getElementType()->kind() == c10::TypeKind::GeneratorType;
  }
  return false;
}

std::unique_ptr<OpPlan> make_plan(const c10::FunctionSchema& schema) {
  auto plan = std::make_unique<OpPlan>();
  plan->name = c10::toString(schema.operator_name());
  for (const auto& argument : schema.arguments()) {
    plan->is_generator.push_back(is_generator_type(argument.real_type()));
  }
  SchemaArguments described = schema_arguments(schema);
  plan->allows_host = std::move(described.allows_host);
  plan->is_written = std::move(described.is_written);
  plan->return_aliases = std::move(described.return_aliases);
  for (int alias_of : plan->return_aliases) {
    plan->returns_arguments = plan->returns_arguments || alias_of >= 0;
  }
  plan->counter = &op_counter(&schema, plan->name);
  return plan;
}

const OpPlan& plan_for(const c10::OperatorHandle& op) {
  const void* key = &op.schema();
  thread_local std::unordered_map<const void*, const OpPlan*> cache;
  auto hit = cache.find(key);
  if (C10_LIKELY(hit != cache.end())) return *hit->second;
  static std::mutex mutex;
  static std::unordered_map<const void*, std::unique_ptr<OpPlan>> plans;
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = plans[key];
  if (!slot) slot = make_plan(op.schema());
  cache.emplace(key, slot.get());
  return *slot;
}

// An op on CPU tensors reaches this backend only through a neuron generator argument
// (torch.randn(..., device="cpu", generator=torch.Generator("neuron"))). Libraries draw on the
// host and copy to the device on purpose (Diffusers' randn_tensor always does for neuron), so
// the draw runs on the CPU from the generator's engine: the same numbers the same generator
// gives on neuron, and its state advances. Replaces each neuron generator argument by its
// engine; false (stack unchanged) without one, leaving the placement error to the caller.
bool use_device_generator_engines(const OpPlan& plan, torch::jit::Stack* stack, size_t first,
                                  size_t num_args) {
  bool found = false;
  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue& value = (*stack)[first + i];
    if (!plan.is_generator[i] || !value.isGenerator()) continue;
    const at::Generator generator = value.toGenerator();
    if (!generator.defined() || generator.device().type() != c10::DeviceType::PrivateUse1) {
      continue;
    }
    value = c10::IValue(host_engine_for(generator, generator.device().index()));
    found = true;
  }
  return found;
}

void run_on_host_kernels(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const OpPlan& plan = plan_for(op);
  const size_t num_args = schema.arguments().size();
  const size_t first = stack->size() - num_args;

  DevicePlacement placement(plan.name.c_str());
  size_t argument_bytes = 0;
  auto visit = [&](const at::Tensor& t, const char* arg, bool host_allowed) {
    placement.visit(t, arg, host_allowed);
    if (t.defined()) argument_bytes += t.nbytes();
  };
  for (size_t i = 0; i < num_args; ++i) {
    const c10::IValue& value = (*stack)[first + i];
    const char* arg = schema.arguments()[i].name().c_str();
    const bool host_allowed = plan.allows_host[i];
    if (value.isTensor()) {
      visit(value.toTensor(), arg, host_allowed);
    } else if (value.isTensorList()) {
      for (const at::Tensor& t : value.toTensorList()) visit(t, arg, host_allowed);
    } else if (value.isOptionalTensorList()) {
      for (const std::optional<at::Tensor> t : value.toOptionalTensorList()) {
        if (t.has_value()) visit(*t, arg, host_allowed);
      }
    } else if (value.isDevice()) {
      placement.visit_device(value.toDevice());
    }
  }
  if (!placement.found() && use_device_generator_engines(plan, stack, first, num_args)) {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
    return;
  }
  const c10::DeviceIndex device = placement.device();
  if (async_candidate(argument_bytes) && launch_async(op, stack, device)) return;
  wait_for_device_work(*plan.counter);

  HostKernelCall call(device, plan.counter);
  c10::SmallVector<std::pair<at::Tensor, at::Tensor>, 2> written;  // (neuron tensor, alias)
  std::vector<c10::IValue> originals;                              // arguments returned as results
  if (plan.returns_arguments) originals.reserve(num_args);
  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue& value = (*stack)[first + i];
    if (plan.returns_arguments) originals.push_back(value);
    if (value.isTensor()) {
      const at::Tensor& t = value.toTensor();
      if (is_device_tensor(t)) {
        at::Tensor alias = call.alias(t);
        if (plan.is_written[i]) written.emplace_back(t, alias);
        value = std::move(alias);
      }
    } else if (value.isTensorList()) {
      c10::List<at::Tensor> converted;
      converted.reserve(value.toTensorList().size());
      for (const at::Tensor& t : value.toTensorList()) {
        if (is_device_tensor(t)) {
          at::Tensor alias = call.alias(t);
          if (plan.is_written[i]) written.emplace_back(t, alias);
          converted.push_back(std::move(alias));
        } else {
          converted.push_back(t);
        }
      }
      value = std::move(converted);
    } else if (value.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> converted;
      for (const std::optional<at::Tensor> t : value.toOptionalTensorList()) {
        converted.push_back(t.has_value() && is_device_tensor(*t) ? std::optional(call.alias(*t))
                                                                  : t);
      }
      value = std::move(converted);
    } else if (value.isDevice()) {
      if (value.toDevice().type() == c10::DeviceType::PrivateUse1) {
        value = c10::IValue(c10::Device(c10::DeviceType::CPU));
      }
    } else if (plan.is_generator[i]) {
      std::optional<at::Generator> generator;
      if (value.isGenerator()) generator = value.toGenerator();
      value = c10::IValue(host_engine_for(generator, device));
    }
  }

  call.run(schema.name().c_str(),
           [&] { op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack); });

  for (const auto& [device_tensor, alias] : written) {
    call.write_back(device_tensor, alias);
  }
  const size_t num_returns = schema.returns().size();
  const size_t returns_first = stack->size() - num_returns;
  for (size_t j = 0; j < num_returns; ++j) {
    c10::IValue& value = (*stack)[returns_first + j];
    const int alias_of = plan.return_aliases[j];
    if (alias_of >= 0) {
      value = originals[static_cast<size_t>(alias_of)];
    } else if (value.isTensor()) {
      value = call.adopt(std::move(value).toTensor());
    } else if (value.isTensorList()) {
      c10::List<at::Tensor> converted;
      for (const at::Tensor& t : value.toTensorList()) converted.push_back(call.adopt(t));
      value = std::move(converted);
    }
  }
  plan.counter->executed.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

void run_on_host_kernels_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_on_host_kernels(op, stack);
}

void register_host_kernel_fallback(torch::Library& m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&run_on_host_kernels>());
}

void register_direct_host_kernels() {
  // An op with both a CPU kernel and a generic (composite) one reaches a backend without its
  // own kernel through the generic one. For structured ops (add, mul, ...) that kernel runs
  // shape inference, allocates and calls the out= variant, whose host kernel runs shape
  // inference again; for others (native_layer_norm, mish_backward, ...) it is a
  // decomposition with other numerics than the CPU's. Sending them straight to their CPU
  // kernels avoids both. For a CompositeImplicitAutograd op a direct kernel also means its
  // autograd is the CPU's (its Autograd kernel instead of the decomposition's graph).
  // native_channel_shuffle keeps its decomposition: it only permutes values (the same
  // either way), and its Autograd kernel raises "derivative not implemented".
  static const std::unique_ptr<torch::Library> library =
      register_for_aten_ops<&run_on_host_kernels>(
          c10::DispatchKey::PrivateUse1, [](const c10::OperatorHandle& op) {
            using c10::DispatchKey;
            const bool composite =
                op.hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutogradNonFunctional) ||
                op.hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutograd) ||
                op.hasKernelForDispatchKey(DispatchKey::CompositeImplicitAutograd);
            // Without a composite kernel the fallback reaches the op anyway.
            return composite && op.hasKernelForDispatchKey(DispatchKey::CPU) &&
                   op.operator_name().name != "aten::native_channel_shuffle";
          });
  (void)library;
}

}  // namespace torchneuron
