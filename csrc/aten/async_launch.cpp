#include "async_launch.h"

#include <ATen/Parallel.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <atomic>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "caching_allocator.h"
#include "device_state.h"
#include "host_alias.h"
#include "runtime_status.h"
#include "stream_state.h"

namespace torchneuron {
namespace {

thread_local bool tls_on_worker = false;
std::atomic<int64_t> g_pending{0};  // launched ops not yet finished (and freed)
std::atomic<bool> g_has_error{false};
std::mutex g_error_mutex;
std::exception_ptr g_error;  // the first error since the last raise; guarded by g_error_mutex

size_t min_async_bytes() {
  static const size_t value = [] {
    const char* text = std::getenv("TORCHNEURON_ASYNC_MIN_BYTES");
    if (text == nullptr || *text == '\0') return size_t{256} * 1024;
    char* end = nullptr;
    const unsigned long long parsed = std::strtoull(text, &end, 10);
    TORCH_CHECK(*text != '-' && end != text && *end == '\0',
                "TORCHNEURON_ASYNC_MIN_BYTES must be a number of bytes (e.g. 262144; 0 launches "
                "every eligible op asynchronously), got '",
                text, "'");
    return static_cast<size_t>(parsed);
  }();
  return value;
}

// What launching an op asynchronously needs to know, derived once from its schema.
struct AsyncPlan {
  bool eligible = true;
  std::vector<bool> is_written;     // per argument: mutated in place (Tensor(a!))
  std::vector<int> return_aliases;  // per return: index of the argument it returns, or -1
  std::string name;
  std::atomic<int> meta_failures{0};  // after a few, the op stays on the inline path
};

constexpr int kMetaFailuresBeforeGivingUp = 8;

c10::TypePtr unwrap_optional(const c10::TypePtr& type) {
  if (auto optional = type->cast<c10::OptionalType>()) return optional->getElementType();
  return type;
}

bool is_tensor_or_tensor_list(const c10::TypePtr& type) {
  const c10::TypePtr plain = unwrap_optional(type);
  if (plain->kind() == c10::TypeKind::TensorType) return true;
  if (auto list = plain->cast<c10::ListType>()) {
    return unwrap_optional(list->getElementType())->kind() == c10::TypeKind::TensorType;
  }
  return false;
}

std::unique_ptr<AsyncPlan> make_plan(const c10::OperatorHandle& op) {
  auto plan = std::make_unique<AsyncPlan>();
  const c10::FunctionSchema& schema = op.schema();
  plan->name = c10::toString(schema.operator_name());
  // Shapes that depend on data, random draws (the generator's state is read on the host)
  // and ops that change a tensor's geometry in place run inline.
  for (at::Tag tag : {at::Tag::dynamic_output_shape, at::Tag::data_dependent_output,
                      at::Tag::nondeterministic_seeded, at::Tag::inplace_view}) {
    if (op.hasTag(tag)) plan->eligible = false;
  }
  const auto& arguments = schema.arguments();
  for (const auto& argument : arguments) {
    const c10::TypeKind kind = unwrap_optional(argument.real_type())->kind();
    if (kind == c10::TypeKind::GeneratorType || kind == c10::TypeKind::StorageType ||
        kind == c10::TypeKind::StreamObjType || kind == c10::TypeKind::AnyType) {
      plan->eligible = false;
    }
    plan->is_written.push_back(argument.alias_info() != nullptr &&
                               argument.alias_info()->isWrite());
  }
  for (const auto& ret : schema.returns()) {
    // Results must be tensors: a number or a bool (item, equal, ...) is read from data.
    if (!is_tensor_or_tensor_list(ret.real_type())) plan->eligible = false;
    int alias_of = -1;
    if (ret.alias_info() != nullptr && ret.alias_info()->isWrite()) {
      for (size_t i = 0; i < arguments.size(); ++i) {
        const auto* info = arguments[i].alias_info();
        if (info != nullptr && info->beforeSets() == ret.alias_info()->beforeSets()) {
          alias_of = static_cast<int>(i);
          break;
        }
      }
    }
    plan->return_aliases.push_back(alias_of);
  }
  return plan;
}

AsyncPlan& plan_for(const c10::OperatorHandle& op) {
  const void* key = &op.schema();
  thread_local std::unordered_map<const void*, AsyncPlan*> cache;
  auto hit = cache.find(key);
  if (C10_LIKELY(hit != cache.end())) return *hit->second;
  static std::mutex mutex;
  static std::unordered_map<const void*, std::unique_ptr<AsyncPlan>> plans;
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = plans[key];
  if (!slot) slot = make_plan(op);
  cache.emplace(key, slot.get());
  return *slot;
}

bool same_geometry(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.strides() == b.strides() &&
         a.storage_offset() == b.storage_offset();
}

// The meta twins of one op's arguments: tensors sharing a neuron storage share a meta
// storage, so the meta kernel sees the same aliasing (overlap checks, in-place views).
class MetaArguments {
 public:
  explicit MetaArguments(c10::DeviceIndex device) : device_(device) {}

  // The meta form of `value`; false when the op cannot launch asynchronously.
  bool convert(const c10::IValue& value, bool written, c10::IValue* out) {
    if (value.isTensor()) {
      at::Tensor meta;
      if (!tensor(value.toTensor(), written, &meta)) return false;
      *out = std::move(meta);
    } else if (value.isTensorList()) {
      c10::List<at::Tensor> list;
      list.reserve(value.toTensorList().size());
      for (const at::Tensor& t : value.toTensorList()) {
        at::Tensor meta;
        if (!tensor(t, written, &meta)) return false;
        list.push_back(std::move(meta));
      }
      *out = std::move(list);
    } else if (value.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> list;
      for (const std::optional<at::Tensor> t : value.toOptionalTensorList()) {
        if (!t.has_value()) {
          list.push_back(std::nullopt);
          continue;
        }
        at::Tensor meta;
        if (!tensor(*t, written, &meta)) return false;
        list.push_back(std::move(meta));
      }
      *out = std::move(list);
    } else if (value.isDevice()) {
      if (value.toDevice().type() != c10::DeviceType::PrivateUse1) return false;
      *out = c10::IValue(c10::Device(c10::DeviceType::Meta));
    } else {
      *out = value;
    }
    return true;
  }

  // After the meta kernel: whether every written argument kept its geometry and storage
  // (a resize or re-pointing must run inline, where write-back carries it over).
  bool written_unchanged() const {
    for (const auto& [meta, original] : written_) {
      if (!same_geometry(meta, original) || meta.storage().nbytes() != original.storage().nbytes() ||
          meta.storage().unsafeGetStorageImpl() != storage_for(original)) {
        return false;
      }
    }
    return true;
  }

  // Whether a meta result uses an argument's storage (a view of an argument).
  bool is_argument_storage(const c10::StorageImpl* storage) const {
    for (const auto& entry : storages_) {
      if (entry.second.unsafeGetStorageImpl() == storage) return true;
    }
    return false;
  }

 private:
  bool tensor(const at::Tensor& t, bool written, at::Tensor* out) {
    if (!t.defined()) {
      *out = t;
      return true;
    }
    if (t.device().is_cpu()) {
      if (written) return false;  // a host tensor written by a device op: run inline
      *out = t;                   // scalars and index lists are read by the meta kernel as is
      return true;
    }
    if (t.device().type() != c10::DeviceType::PrivateUse1 || t.device().index() != device_ ||
        t.layout() != at::kStrided || t.is_conj() || t.is_neg() || t.is_nested()) {
      return false;
    }
    const c10::StorageImpl* device_storage = t.storage().unsafeGetStorageImpl();
    c10::Storage storage;
    for (const auto& entry : storages_) {
      if (entry.first == device_storage) storage = entry.second;
    }
    if (!storage) {
      storage = c10::Storage(c10::Storage::use_byte_size_t(), t.storage().nbytes(),
                             c10::DataPtr(nullptr, c10::Device(c10::DeviceType::Meta)),
                             c10::GetAllocator(c10::DeviceType::Meta), /*resizable=*/true);
      storages_.emplace_back(device_storage, storage);
    }
    at::Tensor meta = at::detail::make_tensor<c10::TensorImpl>(
        std::move(storage), c10::DispatchKeySet(c10::DispatchKey::Meta), t.dtype());
    meta.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
    if (written) written_.emplace_back(meta, t);
    *out = std::move(meta);
    return true;
  }

  const c10::StorageImpl* storage_for(const at::Tensor& original) const {
    for (const auto& entry : storages_) {
      if (entry.first == original.storage().unsafeGetStorageImpl()) {
        return entry.second.unsafeGetStorageImpl();
      }
    }
    return nullptr;
  }

  c10::DeviceIndex device_;
  c10::SmallVector<std::pair<const c10::StorageImpl*, c10::Storage>, 4> storages_;
  c10::SmallVector<std::pair<at::Tensor, at::Tensor>, 2> written_;  // (meta, neuron original)
};

// The worker's copy of an argument: a neuron tensor becomes a new tensor object over the
// same storage (the caller may change the original's geometry meanwhile, e.g. t_()), a
// host tensor a copy of its values as they are now.
at::Tensor snapshot(const at::Tensor& t) {
  if (!t.defined()) return t;
  if (t.device().is_cpu()) return t.clone();
  return device_tensor_on(t.storage(), t);
}

c10::IValue snapshot(const c10::IValue& value) {
  if (value.isTensor()) return snapshot(value.toTensor());
  if (value.isTensorList()) {
    c10::List<at::Tensor> list;
    list.reserve(value.toTensorList().size());
    for (const at::Tensor& t : value.toTensorList()) list.push_back(snapshot(t));
    return list;
  }
  if (value.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> list;
    for (const std::optional<at::Tensor> t : value.toOptionalTensorList()) {
      list.push_back(t.has_value() ? std::optional<at::Tensor>(snapshot(*t)) : std::nullopt);
    }
    return list;
  }
  return value;
}

// A neuron result allocated now for what the meta kernel said; null when it cannot be.
bool allocate_result(const at::Tensor& meta, const MetaArguments& arguments,
                     c10::SmallVector<const c10::StorageImpl*, 4>& seen, c10::DeviceIndex device,
                     at::Tensor* out) {
  if (!meta.defined()) {
    *out = meta;
    return true;
  }
  const c10::StorageImpl* storage = meta.storage().unsafeGetStorageImpl();
  if (!meta.is_meta() || arguments.is_argument_storage(storage)) return false;
  for (const c10::StorageImpl* other : seen) {
    if (other == storage) return false;  // results sharing memory: run inline
  }
  seen.push_back(storage);
  *out = device_tensor_on(new_device_storage(meta.storage().nbytes(), device), meta);
  return true;
}

// One launched op, owned by its task.
struct LaunchedOp {
  c10::OperatorHandle op;
  const AsyncPlan* plan;
  torch::jit::Stack stack;           // snapshots of the arguments
  std::vector<c10::IValue> results;  // per return: the caller's fresh results, or None
  std::vector<ReservedAllocations::Block> reserved;
  c10::DeviceIndex device;
  c10::Stream stream;
  int threads;

  void run() {
    tls_on_worker = true;
    if (current_device() != device) set_device(device);
    if (current_stream(device) != stream) exchange_stream(stream);
    if (at::get_num_threads() != threads) at::set_num_threads(threads);
    try {
      {
        const ReservedAllocations scope(&reserved);
        op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), &stack);
      }
      settle();
    } catch (c10::Error& error) {
      error.add_context("neuron: raised by " + plan->name +
                        ", which ran asynchronously; set NEURON_LAUNCH_BLOCKING=1 to raise "
                        "errors where the op is called");
      record(std::current_exception());
    } catch (const std::exception& error) {
      record(std::make_exception_ptr(c10::Error(
          {__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
          "neuron: " + plan->name + " failed while running asynchronously: " + error.what())));
    }
  }

  // Puts each result the kernel computed into the memory the caller already holds, unless
  // it is there already (it was allocated from the reservation).
  void settle() {
    const size_t first = stack.size() - results.size();
    for (size_t j = 0; j < results.size(); ++j) {
      const c10::IValue& computed = stack[first + j];
      if (results[j].isTensor()) {
        settle_one(computed.toTensor(), results[j].toTensor());
      } else if (results[j].isTensorList()) {
        const auto targets = results[j].toTensorList();
        const auto values = computed.toTensorList();
        for (size_t k = 0; k < targets.size(); ++k) settle_one(values[k], targets[k]);
      }
    }
  }

  static void settle_one(const at::Tensor& computed, const at::Tensor& target) {
    if (!computed.defined() || !target.defined()) return;
    const void* at = computed.storage().data();
    if (at == target.storage().data() && same_geometry(computed, target) &&
        computed.dtype() == target.dtype()) {
      return;
    }
    const char* begin = static_cast<const char*>(target.storage().data());
    const char* end = begin + target.storage().nbytes();
    const bool overlaps = at >= begin && at < end;
    target.copy_(overlaps ? computed.clone() : computed);
  }

  static void record(std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(g_error_mutex);
    if (!g_error) g_error = std::move(error);
    g_has_error.store(true);
  }
};

void run_launched(void* arg) {
  {
    std::unique_ptr<LaunchedOp> launched(static_cast<LaunchedOp*>(arg));
    launched->run();
  }  // its arguments and results are released here, on the worker
  g_pending.fetch_sub(1, std::memory_order_release);
}

}  // namespace

bool async_launches() {
  static const bool value = nrt_launch_blocking() == 0;
  return value;
}

bool on_stream_worker() { return tls_on_worker; }

bool async_candidate(size_t argument_bytes) {
  if (!async_launches() || tls_on_worker) return false;
  return g_pending.load(std::memory_order_relaxed) > 0 || argument_bytes >= min_async_bytes();
}

void raise_launch_error() {
  if (!g_has_error.load()) return;
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(g_error_mutex);
    error = std::exchange(g_error, nullptr);
    g_has_error.store(false);
  }
  if (error) std::rethrow_exception(error);
}

void wait_for_device_work() {
  if (tls_on_worker) return;
  if (g_pending.load(std::memory_order_acquire) != 0) {
    const c10::DeviceIndex count = device_count();
    for (c10::DeviceIndex d = 0; d < count; ++d) NEURON_CHECK(nrt_device_synchronize(d));
  }
  raise_launch_error();
}

bool launch_async(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                  c10::DeviceIndex device) {
  AsyncPlan& plan = plan_for(op);
  if (!plan.eligible || plan.meta_failures.load(std::memory_order_relaxed) >=
                            kMetaFailuresBeforeGivingUp) {
    return false;
  }
  const size_t num_args = op.schema().arguments().size();
  const size_t first = stack->size() - num_args;

  // Shapes, dtypes and strides of the results, from the meta kernel.
  MetaArguments arguments(device);
  torch::jit::Stack meta;
  meta.reserve(num_args);
  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue converted;
    if (!arguments.convert((*stack)[first + i], plan.is_written[i], &converted)) return false;
    meta.push_back(std::move(converted));
  }
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
  } catch (const std::exception&) {
    // No meta kernel, or an error the inline run will raise with the real kernel's words.
    plan.meta_failures.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  if (!arguments.written_unchanged()) return false;

  auto launched = std::make_unique<LaunchedOp>(LaunchedOp{
      op, &plan, {}, {}, {}, device, current_stream(device), at::get_num_threads()});
  std::vector<c10::IValue> results;  // what the caller gets
  results.reserve(meta.size());
  c10::SmallVector<const c10::StorageImpl*, 4> seen;
  for (size_t j = 0; j < meta.size(); ++j) {
    const int alias_of = plan.return_aliases[j];
    if (alias_of >= 0) {
      results.push_back((*stack)[first + static_cast<size_t>(alias_of)]);
      launched->results.emplace_back();
      continue;
    }
    if (meta[j].isTensor()) {
      at::Tensor out;
      if (!allocate_result(meta[j].toTensor(), arguments, seen, device, &out)) return false;
      results.emplace_back(out);
      launched->results.emplace_back(out);
    } else if (meta[j].isTensorList()) {
      c10::List<at::Tensor> outs;
      for (const at::Tensor& m : meta[j].toTensorList()) {
        at::Tensor out;
        if (!allocate_result(m, arguments, seen, device, &out)) return false;
        outs.push_back(out);
      }
      results.emplace_back(outs);
      launched->results.emplace_back(outs);
    } else if (meta[j].isNone()) {
      results.emplace_back();
      launched->results.emplace_back();
    } else {
      return false;
    }
  }
  for (const c10::IValue& result : launched->results) {
    auto reserve = [&](const at::Tensor& t) {
      if (t.defined() && t.storage().nbytes() > 0) {
        launched->reserved.push_back({t.storage().mutable_data(), t.storage().nbytes(), false});
      }
    };
    if (result.isTensor()) reserve(result.toTensor());
    if (result.isTensorList()) {
      for (const at::Tensor& t : result.toTensorList()) reserve(t);
    }
  }
  launched->stack.reserve(num_args);
  for (size_t i = 0; i < num_args; ++i) launched->stack.push_back(snapshot((*stack)[first + i]));

  LaunchedOp* task = launched.release();
  g_pending.fetch_add(1, std::memory_order_acq_rel);
  const nrt_status status =
      nrt_stream_launch(device, static_cast<int>(task->stream.id()), &run_launched, task);
  if (status != NRT_SUCCESS) {
    delete task;
    g_pending.fetch_sub(1, std::memory_order_release);
    NEURON_CHECK(status);
  }
  stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(first), stack->end());
  for (c10::IValue& result : results) stack->push_back(std::move(result));
  return true;
}

}  // namespace torchneuron
