// The shapes, strides and dtypes of an asynchronous launch's results, from the op's meta
// kernel, cached per thread and argument signature (launch_spec.h).
#include "launch/launch_spec.h"

#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/SmallVector.h>

#include <string>
#include <unordered_map>
#include <utility>

#include "memory/host_alias.h"

namespace torchneuron {
namespace {

// The meta twins of one op's arguments: tensors sharing a neuron storage share a meta
// storage, so the meta kernel sees the same aliasing (overlap checks, in-place views).
class MetaArguments {
 public:
  explicit MetaArguments(c10::DeviceIndex device) : device_(device) {}

  // The meta form of argument `index`, `value`; false when the op cannot launch
  // asynchronously.
  bool convert(size_t index, const c10::IValue& value, bool written, bool host_allowed,
               c10::IValue* out) {
    host_allowed_ = host_allowed;
    if (value.isTensor()) {
      at::Tensor meta;
      if (!tensor(value.toTensor(), written, &meta, index)) return false;
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

  // After the meta kernel: whether every written argument kept its geometry and storage, or
  // is an empty out= tensor argument the kernel resized (added to `resizes`, for the caller
  // to resize first). Other resizes and re-pointing must run inline, where write-back
  // carries them over.
  bool written_allow_launch(std::vector<OutputResize>* resizes) const {
    for (const auto& [meta, original, index] : written_) {
      const bool same_storage = meta.storage().unsafeGetStorageImpl() == storage_for(original);
      if (same_storage && same_geometry(meta, original) &&
          meta.storage().nbytes() == original.storage().nbytes()) {
        continue;
      }
      // Composite ops (arange, abs, ...) allocate an empty result and call the out= variant.
      // An empty storage cannot be in use by launched work, so resizing it on the calling
      // thread is safe, and the meta kernel's contiguous result is what resize_ makes. With a
      // non-contiguous input, CPU eager's out= kernel may restride the result to the input's
      // layout (TensorIterator does) where the meta kernel resizes it contiguous: inline.
      const bool fresh_output = index != kInList && original.storage().nbytes() == 0 &&
                                original.storage_offset() == 0 && meta.storage_offset() == 0 &&
                                meta.is_contiguous() && inputs_contiguous_;
      if (!same_storage || !fresh_output) return false;
      resizes->push_back({index, meta.sizes().vec()});
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
  static constexpr size_t kInList = static_cast<size_t>(-1);

  bool tensor(const at::Tensor& t, bool written, at::Tensor* out, size_t index = kInList) {
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
    if (written) {
      written_.push_back({meta, t, index});
    } else if (!t.is_contiguous()) {
      inputs_contiguous_ = false;
    }
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
  bool host_allowed_ = false;      // the argument being converted accepts host tensors
  bool inputs_contiguous_ = true;  // every device tensor read (not written) is contiguous
  c10::SmallVector<std::pair<const c10::StorageImpl*, c10::Storage>, 4> storages_;
  struct Written {
    at::Tensor meta, original;  // the neuron original
    size_t index;               // its argument, or kInList
  };
  c10::SmallVector<Written, 2> written_;
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
    if (!arguments.convert(i, stack[first + i], plan.is_written[i], plan.allows_host[i],
                           &converted)) {
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
  if (!arguments.written_allow_launch(&spec->resizes)) return spec;
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

}  // namespace

std::shared_ptr<const LaunchSpec> launch_spec_for(const c10::OperatorHandle& op, AsyncPlan& plan,
                                                  const torch::jit::Stack& stack, size_t first,
                                                  c10::DeviceIndex device) {
  std::string key;
  const bool cacheable = LaunchSpecCache::key(op.schema(), stack, first, &key);
  std::shared_ptr<const LaunchSpec> spec = cacheable ? tls_specs.find(key) : nullptr;
  if (spec == nullptr) {
    spec = spec_from_meta(op, plan, stack, first, device);
    if (cacheable) tls_specs.store(std::move(key), spec);
  }
  return spec;
}

at::Tensor make_result(const TensorSpec& spec, c10::DeviceIndex device) {
  if (!spec.defined) return at::Tensor();
  at::Tensor result = at::detail::make_tensor<c10::TensorImpl>(
      new_device_storage(spec.nbytes, device), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      spec.dtype);
  result.unsafeGetTensorImpl()->set_sizes_and_strides(spec.sizes, spec.strides, spec.offset);
  return result;
}

}  // namespace torchneuron
