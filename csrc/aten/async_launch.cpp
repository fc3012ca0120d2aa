#include "async_launch.h"

#include <ATen/Parallel.h>
#include <Python.h>
#include <c10/core/Allocator.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <atomic>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "caching_allocator.h"
#include "device_activity.h"
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
  std::vector<bool> allows_host;    // per argument: CPU tensors accepted (index lists)
  std::vector<int> return_aliases;  // per return: index of the argument it returns, or -1
  std::string name;
  std::atomic<int> meta_failures{0};        // after a few, the op stays on the inline path
  std::atomic<bool> meta_disagreed{false};  // a result's shape was not the meta kernel's
  // The CPU kernel refuses tensor arguments of different dtypes, which the meta kernel
  // does not check: such calls run inline, so the error comes from the call.
  bool same_dtypes = false;
};

bool refuses_mixed_dtypes(const std::string& name) {
  static const std::unordered_set<std::string> products = {
      "aten::mm",
      "aten::bmm",
      "aten::addmm",
      "aten::baddbmm",
      "aten::addmv",
      "aten::mv",
      "aten::_scaled_dot_product_flash_attention_for_cpu",
      "aten::_scaled_dot_product_flash_attention_for_cpu_backward"};
  return products.count(name) != 0;
}

bool mixes_dtypes(const torch::jit::Stack& stack, size_t first) {
  std::optional<c10::ScalarType> seen;
  for (size_t i = first; i < stack.size(); ++i) {
    if (!stack[i].isTensor() || !stack[i].toTensor().defined()) continue;
    const c10::ScalarType type = stack[i].toTensor().scalar_type();
    if (seen && *seen != type) return true;
    seen = type;
  }
  return false;
}

// Ops whose meta kernel is known to describe exactly what the CPU kernel computes: every
// elementwise op, reduction and in-place op (TensorIterator's shape rules on both sides),
// foreach and fused optimizer ops, and the hot ops of transformer training and inference.
// Other meta kernels can differ (batch norm in evaluation returns empty saved statistics on
// the CPU and full-size ones on meta, embedding_bag's offset2bag has other sizes, and
// layer norm's saved statistics are float32 on meta but bfloat16 on the CPU for bfloat16
// inputs): those ops run inline, after launched work.
bool meta_matches_cpu(const c10::OperatorHandle& op) {
  if (op.hasTag(at::Tag::pointwise) || op.hasTag(at::Tag::reduction) ||
      op.hasTag(at::Tag::inplace)) {
    return true;
  }
  const std::string& qualified = op.schema().name();
  if (qualified.rfind("aten::", 0) != 0) return false;
  const std::string name = qualified.substr(6);
  if (name.rfind("_foreach_", 0) == 0 || name.rfind("_fused_", 0) == 0) return true;
  static const std::unordered_set<std::string> known = {
      "mm",
      "bmm",
      "addmm",
      "baddbmm",
      "addmv",
      "mv",
      "_softmax",
      "_log_softmax",
      "_softmax_backward_data",
      "_log_softmax_backward_data",
      "_scaled_dot_product_flash_attention_for_cpu",
      "_scaled_dot_product_flash_attention_for_cpu_backward",
      "cat",
      "stack",
      "index_select",
      "embedding",
      "embedding_dense_backward",
      "gather",
      "scatter",
      "scatter_add",
      "_to_copy",
      "constant_pad_nd",
      "tril",
      "triu",
      "cumsum",
      "arange",
      "full",
      "nll_loss_forward",
      "nll_loss_backward",
      "topk",
      "repeat",
      "select_backward",
      "slice_backward",
      "gelu_backward",
      "silu_backward",
      "threshold_backward",
      "sigmoid_backward",
      "tanh_backward",
      "softplus_backward",
      "_unsafe_index"};
  return known.count(name) != 0;
}

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
  if (!meta_matches_cpu(op)) plan->eligible = false;
  plan->same_dtypes = refuses_mixed_dtypes(schema.name());
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
    plan->allows_host.push_back(argument.real_type()->str() == "Tensor?[]");
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
  bool convert(const c10::IValue& value, bool written, bool host_allowed, c10::IValue* out) {
    host_allowed_ = host_allowed;
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
      if (!same_geometry(meta, original) ||
          meta.storage().nbytes() != original.storage().nbytes() ||
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
      // CPU scalars and index lists are read by the meta kernel as they are; any other host
      // tensor is an error the inline run words (meta kernels do not check devices).
      if (written || (t.dim() != 0 && !host_allowed_)) return false;
      *out = t;
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
  bool host_allowed_ = false;  // the argument being converted accepts host tensors
  c10::SmallVector<std::pair<const c10::StorageImpl*, c10::Storage>, 4> storages_;
  c10::SmallVector<std::pair<at::Tensor, at::Tensor>, 2> written_;  // (meta, neuron original)
};

// The worker's copies of one launch's arguments and results. A neuron tensor becomes a new
// tensor object (the caller may change the original's geometry meanwhile, e.g. t_()) over a
// storage that does not own the memory when the caching allocator does: a free by the
// caller returns the block to its stream's pool at once, as on a device with stream-ordered
// allocation, and only work queued after this launch on that stream can get it again (the
// worker allocates from a pool of its own). Other memory (shared segments) is held until the
// work completes. Tensors sharing a storage get snapshots sharing one, so overlap checks on
// the worker see what the caller's tensors would. A host tensor becomes a copy of its
// values as they are now.
class Snapshots {
 public:
  at::Tensor operator()(const at::Tensor& t) {
    if (!t.defined()) return t;
    if (t.device().is_cpu()) return host_copy(t);
    return device_tensor_on(storage_for(t.storage()), t);
  }

  c10::IValue operator()(const c10::IValue& value) {
    if (value.isTensor()) return (*this)(value.toTensor());
    if (value.isTensorList()) {
      c10::List<at::Tensor> list;
      list.reserve(value.toTensorList().size());
      for (const at::Tensor& t : value.toTensorList()) list.push_back((*this)(t));
      return list;
    }
    if (value.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> list;
      for (const std::optional<at::Tensor> t : value.toOptionalTensorList()) {
        list.push_back(t.has_value() ? std::optional<at::Tensor>((*this)(*t)) : std::nullopt);
      }
      return list;
    }
    return value;
  }

 private:
  c10::Storage storage_for(const c10::Storage& storage) {
    const c10::StorageImpl* key = storage.unsafeGetStorageImpl();
    for (const auto& [device, copy] : storages_) {
      if (device == key) return copy;
    }
    c10::Storage copy = storage;  // held: memory the caching allocator does not own
    if (CachingAllocator::owns(storage.data_ptr())) {
      copy = c10::Storage(c10::Storage::use_byte_size_t(), storage.nbytes(),
                          c10::DataPtr(storage.mutable_data(), storage.device()),
                          &caching_allocator(), /*resizable=*/false);
    }
    storages_.emplace_back(key, copy);
    return copy;
  }

  static at::Tensor host_copy(const at::Tensor& t) {
    at::Tensor copy = t.clone();
    // A Python number wrapped as a tensor promotes types as a number, not as a tensor.
    if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
      copy.unsafeGetTensorImpl()->set_wrapped_number(true);
    }
    return copy;
  }

  c10::SmallVector<std::pair<const c10::StorageImpl*, c10::Storage>, 4> storages_;
};

// What the meta kernel said about one result tensor.
struct TensorSpec {
  bool defined = false;
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
  caffe2::TypeMeta dtype;
  size_t nbytes = 0;
};

// Per return: an argument returned as is (alias), one tensor, a list of them, or None.
struct ResultSpec {
  enum class Kind { kAlias, kTensor, kList, kNone } kind = Kind::kNone;
  std::vector<TensorSpec> tensors;
};

// An op's results for one argument signature, or the verdict that it runs inline.
struct LaunchSpec {
  bool inline_only = false;
  std::vector<ResultSpec> results;
};

// Why a cache: PyTorch registers Python meta kernels over the C++ ones
// (torch/_meta_registrations.py), and a Python meta kernel costs ~200 us a call. Loops run
// the same signatures again and again, so each is asked once per thread.
class LaunchSpecCache {
 public:
  // The cache key of a call: the op, and every argument's value, or for a tensor its
  // device, dtype, geometry and which earlier argument's storage it shares. False when an
  // argument has no such summary (the call is then not cached).
  static bool key(const c10::FunctionSchema& schema, const torch::jit::Stack& stack, size_t first,
                  std::string* out) {
    std::string& k = *out;
    k.reserve(128);
    append(k, &schema);
    c10::SmallVector<const c10::StorageImpl*, 8> storages;
    auto tensor = [&](const at::Tensor& t) {
      if (!t.defined()) {
        k.push_back('u');
        return;
      }
      k.push_back(t.device().is_cpu() ? 'c' : 'n');
      append(k, t.device().index());
      append(k, static_cast<int8_t>(t.scalar_type()));
      append(k, static_cast<int8_t>(t.unsafeGetTensorImpl()->is_wrapped_number()));
      append(k, static_cast<int64_t>(t.dim()));
      for (int64_t v : t.sizes()) append(k, v);
      for (int64_t v : t.strides()) append(k, v);
      append(k, t.storage_offset());
      append(k, t.storage().nbytes());
      const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
      int64_t shared = -1;
      for (size_t i = 0; i < storages.size(); ++i) {
        if (storages[i] == storage) shared = static_cast<int64_t>(i);
      }
      if (shared < 0) storages.push_back(storage);
      append(k, shared);
    };
    for (size_t i = first; i < stack.size(); ++i) {
      const c10::IValue& v = stack[i];
      if (v.isTensor()) {
        tensor(v.toTensor());
      } else if (v.isTensorList()) {
        k.push_back('L');
        append(k, v.toTensorList().size());
        for (const at::Tensor& t : v.toTensorList()) tensor(t);
      } else if (v.isOptionalTensorList()) {
        k.push_back('O');
        for (const std::optional<at::Tensor> t : v.toOptionalTensorList()) {
          if (t.has_value()) {
            tensor(*t);
          } else {
            k.push_back('-');
          }
        }
      } else if (v.isNone()) {
        k.push_back('N');
      } else if (v.isInt()) {
        k.push_back('i');
        append(k, v.toInt());
      } else if (v.isDouble()) {
        k.push_back('d');
        append(k, v.toDouble());
      } else if (v.isBool()) {
        k.push_back(v.toBool() ? 'B' : 'b');
      } else if (v.isIntList()) {
        k.push_back('I');
        const auto list = v.toIntList();
        append(k, list.size());
        for (int64_t x : list) append(k, x);
      } else if (v.isDevice()) {
        k.push_back('D');
        append(k, static_cast<int8_t>(v.toDevice().type()));
        append(k, v.toDevice().index());
      } else if (v.isString()) {
        k.push_back('S');
        const auto text = v.toStringRef();
        append(k, text.size());
        k.append(text);
      } else {
        return false;  // symbolic, complex, lists of floats, ...: not summarised
      }
    }
    return true;
  }

  std::shared_ptr<const LaunchSpec> find(const std::string& key) const {
    auto hit = entries_.find(key);
    return hit == entries_.end() ? nullptr : hit->second;
  }

  void store(std::string key, std::shared_ptr<const LaunchSpec> spec) {
    if (entries_.size() >= kMaxEntries) entries_.clear();  // shapes churn: start over
    entries_.emplace(std::move(key), std::move(spec));
  }

 private:
  static constexpr size_t kMaxEntries = 8192;

  template <class T>
  static void append(std::string& k, const T& value) {
    k.append(reinterpret_cast<const char*>(&value), sizeof(value));
  }

  std::unordered_map<std::string, std::shared_ptr<const LaunchSpec>> entries_;
};

thread_local LaunchSpecCache tls_specs;

// The spec of a meta result; false when it cannot be launched (a view of an argument, a
// result sharing memory with another, not a meta tensor).
bool spec_of(const at::Tensor& meta, const MetaArguments& arguments,
             c10::SmallVector<const c10::StorageImpl*, 4>& seen, TensorSpec* out) {
  if (!meta.defined()) return true;
  const c10::StorageImpl* storage = meta.storage().unsafeGetStorageImpl();
  if (!meta.is_meta() || arguments.is_argument_storage(storage)) return false;
  for (const c10::StorageImpl* other : seen) {
    if (other == storage) return false;
  }
  seen.push_back(storage);
  out->defined = true;
  out->sizes.assign(meta.sizes().begin(), meta.sizes().end());
  out->strides.assign(meta.strides().begin(), meta.strides().end());
  out->offset = meta.storage_offset();
  out->dtype = meta.dtype();
  out->nbytes = meta.storage().nbytes();
  return true;
}

// Runs the meta kernel for the call's results; a spec with inline_only when the call must
// run inline.
std::shared_ptr<const LaunchSpec> spec_from_meta(const c10::OperatorHandle& op, AsyncPlan& plan,
                                                 const torch::jit::Stack& stack, size_t first,
                                                 c10::DeviceIndex device) {
  auto spec = std::make_shared<LaunchSpec>();
  spec->inline_only = true;
  const size_t num_args = stack.size() - first;
  MetaArguments arguments(device);
  torch::jit::Stack meta;
  meta.reserve(num_args);
  for (size_t i = 0; i < num_args; ++i) {
    c10::IValue converted;
    if (!arguments.convert(stack[first + i], plan.is_written[i], plan.allows_host[i], &converted)) {
      return spec;
    }
    meta.push_back(std::move(converted));
  }
  try {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::Meta), &meta);
  } catch (const std::exception&) {
    // No meta kernel, or an error the inline run will raise with the real kernel's words.
    plan.meta_failures.fetch_add(1, std::memory_order_relaxed);
    return spec;
  }
  if (!arguments.written_unchanged()) return spec;
  c10::SmallVector<const c10::StorageImpl*, 4> seen;
  for (size_t j = 0; j < meta.size(); ++j) {
    ResultSpec result;
    if (plan.return_aliases[j] >= 0) {
      result.kind = ResultSpec::Kind::kAlias;
    } else if (meta[j].isTensor()) {
      result.kind = ResultSpec::Kind::kTensor;
      result.tensors.emplace_back();
      if (!spec_of(meta[j].toTensor(), arguments, seen, &result.tensors.back())) return spec;
    } else if (meta[j].isTensorList()) {
      result.kind = ResultSpec::Kind::kList;
      for (const at::Tensor& m : meta[j].toTensorList()) {
        result.tensors.emplace_back();
        if (!spec_of(m, arguments, seen, &result.tensors.back())) return spec;
      }
    } else if (!meta[j].isNone()) {
      return spec;
    }
    spec->results.push_back(std::move(result));
  }
  spec->inline_only = false;
  return spec;
}

// A neuron result of `spec`, allocated now on the caller's stream.
at::Tensor make_result(const TensorSpec& spec, c10::DeviceIndex device) {
  if (!spec.defined) return at::Tensor();
  at::Tensor result = at::detail::make_tensor<c10::TensorImpl>(
      new_device_storage(spec.nbytes, device), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      spec.dtype);
  result.unsafeGetTensorImpl()->set_sizes_and_strides(spec.sizes, spec.strides, spec.offset);
  return result;
}

// One launched op, owned by its task.
struct LaunchedOp {
  c10::OperatorHandle op;
  AsyncPlan* plan;
  torch::jit::Stack stack;  // snapshots of the arguments
  // Per return: the caller's fresh results as objects of the task's own, over the same
  // storages, or None. The caller's tensor objects may be Python objects, and releasing
  // one's last reference here would take the GIL.
  std::vector<c10::IValue> results;
  std::vector<ReservedAllocations::Block> reserved;
  c10::DeviceIndex device;
  c10::Stream stream;
  int threads;
  uint64_t correlation;  // the profiled op that launched it (device_activity.h), or 0

  void run() {
    tls_on_worker = true;
    if (current_device() != device) set_device(device);
    if (current_stream(device) != stream) exchange_stream(stream);
    if (at::get_num_threads() != threads) at::set_num_threads(threads);
    if (correlation != 0) push_launch_correlation(correlation);
    try {
      {
        const ReservedAllocations scope(&reserved, stream.id());
        op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), &stack);
      }
      const ReservedAllocations pool_only(nullptr, stream.id());
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
    if (correlation != 0) pop_launch_correlation();
  }

  // Puts each result the kernel computed into the memory the caller already holds, unless
  // it is there already (it was allocated from the reservation).
  void settle() const {
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

  void settle_one(const at::Tensor& computed, const at::Tensor& target) const {
    if (!computed.defined() || !target.defined()) return;
    if (computed.sizes() != target.sizes() || computed.dtype() != target.dtype()) {
      // The caller already holds a result of the meta kernel's shape: it cannot change now.
      plan->meta_disagreed.store(true);
      TORCH_CHECK(false, "neuron: ", plan->name, " computed a result of shape ", computed.sizes(),
                  " and dtype ", computed.dtype(), " where its meta kernel said ", target.sizes(),
                  " and ", target.dtype(),
                  "; the op now runs inline. Please report this; NEURON_LAUNCH_BLOCKING=1 "
                  "avoids it");
    }
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

bool launched_work_pending() { return g_pending.load(std::memory_order_acquire) != 0; }

bool async_candidate(size_t argument_bytes) {
  if (!async_launches() || tls_on_worker) return false;
  // A memory profile records allocations and frees on the thread that profiles.
  if (C10_UNLIKELY(c10::memoryProfilingEnabled())) return false;
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

WaitingWithoutGil::WaitingWithoutGil() {
  if (Py_IsInitialized() != 0 && PyGILState_Check() != 0) {
    saved_ = PyEval_SaveThread();
  }
}

WaitingWithoutGil::~WaitingWithoutGil() {
  if (saved_ != nullptr) PyEval_RestoreThread(static_cast<PyThreadState*>(saved_));
}

void wait_for_device_work() {
  if (tls_on_worker) return;
  if (g_pending.load(std::memory_order_acquire) != 0) {
    const c10::DeviceIndex count = device_count();
    nrt_status status = NRT_SUCCESS;
    {
      const WaitingWithoutGil no_gil;
      for (c10::DeviceIndex d = 0; d < count && status == NRT_SUCCESS; ++d) {
        status = nrt_device_synchronize(d);
      }
    }
    NEURON_CHECK(status);
  }
  raise_launch_error();
}

bool launch_async(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                  c10::DeviceIndex device) {
  AsyncPlan& plan = plan_for(op);
  if (!plan.eligible || plan.meta_disagreed.load(std::memory_order_relaxed) ||
      plan.meta_failures.load(std::memory_order_relaxed) >= kMetaFailuresBeforeGivingUp) {
    return false;
  }
  const size_t num_args = op.schema().arguments().size();
  const size_t first = stack->size() - num_args;
  if (plan.same_dtypes && mixes_dtypes(*stack, first)) return false;

  // Shapes, dtypes and strides of the results: the meta kernel's, once per signature.
  std::string key;
  const bool cacheable = LaunchSpecCache::key(op.schema(), *stack, first, &key);
  std::shared_ptr<const LaunchSpec> spec = cacheable ? tls_specs.find(key) : nullptr;
  if (spec == nullptr) {
    spec = spec_from_meta(op, plan, *stack, first, device);
    if (cacheable) tls_specs.store(std::move(key), spec);
  }
  if (spec->inline_only) return false;

  auto launched = std::make_unique<LaunchedOp>(LaunchedOp{op,
                                                          &plan,
                                                          {},
                                                          {},
                                                          {},
                                                          device,
                                                          current_stream(device),
                                                          at::get_num_threads(),
                                                          current_launch_correlation()});
  std::vector<c10::IValue> results;  // what the caller gets
  results.reserve(spec->results.size());
  Snapshots snapshots;
  for (size_t j = 0; j < spec->results.size(); ++j) {
    const ResultSpec& result = spec->results[j];
    switch (result.kind) {
      case ResultSpec::Kind::kAlias:
        results.push_back((*stack)[first + static_cast<size_t>(plan.return_aliases[j])]);
        launched->results.emplace_back();
        break;
      case ResultSpec::Kind::kTensor: {
        at::Tensor out = make_result(result.tensors[0], device);
        launched->results.emplace_back(snapshots(out));
        results.emplace_back(std::move(out));
        break;
      }
      case ResultSpec::Kind::kList: {
        c10::List<at::Tensor> outs;
        for (const TensorSpec& t : result.tensors) outs.push_back(make_result(t, device));
        launched->results.emplace_back(snapshots(c10::IValue(outs)));
        results.emplace_back(std::move(outs));
        break;
      }
      case ResultSpec::Kind::kNone:
        results.emplace_back();
        launched->results.emplace_back();
        break;
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
  for (size_t i = 0; i < num_args; ++i) {
    launched->stack.push_back(snapshots((*stack)[first + i]));
  }

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
