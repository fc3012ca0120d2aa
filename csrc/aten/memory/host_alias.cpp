// CPU aliases of neuron tensors and the adoption of host results as neuron tensors
// (host_alias.h): step (1) and (3) of the host-kernel contract.
#include "memory/host_alias.h"

#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>

#include <cstring>

#include "launch/async_launch.h"
#include "memory/allocation_redirect.h"
#include "memory/caching_allocator.h"
#include "ops/op_tracking.h"

namespace torchneuron {
namespace {

c10::Storage make_storage(size_t nbytes, c10::DataPtr data, c10::Allocator* allocator,
                          bool resizable = true) {
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), nbytes, std::move(data), allocator, resizable));
}

at::Tensor tensor_on(c10::Storage storage, c10::DispatchKey key, const at::Tensor& like) {
  at::Tensor result = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(key), like.dtype());
  auto* impl = result.unsafeGetTensorImpl();
  impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  if (like.is_conj()) impl->_set_conj(true);
  if (like.is_neg()) impl->_set_neg(true);
  return result;
}

}  // namespace

namespace {

// Alias objects (a CPU tensor and its storage) are recycled per thread: creating and
// destroying a TensorImpl and a StorageImpl for every argument of every op is a large part
// of a small op's cost.
thread_local HostAliasSet::Pool tls_alias_pool;

// Element-wise equality, inline: most arrays here have one to four elements.
bool same(c10::IntArrayRef a, c10::IntArrayRef b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return false;
  }
  return true;
}

// Gives a recycled alias (whose storage object is reused, so only its bytes changed) the
// dtype and geometry of `like`. Loops run the same shapes over and over, so each field is
// written only when it differs: a geometry write recomputes contiguity and other flags.
void retarget(const at::Tensor& alias, const at::Tensor& like) {
  auto* impl = alias.unsafeGetTensorImpl();
  if (impl->dtype() != like.dtype()) impl->set_storage_and_dtype(impl->storage(), like.dtype());
  if (!same(impl->sizes(), like.sizes()) || !same(impl->strides(), like.strides())) {
    impl->set_sizes_and_strides(like.sizes(), like.strides(), like.storage_offset());
  } else if (impl->storage_offset() != like.storage_offset()) {
    impl->set_storage_offset(like.storage_offset());
  }
  if (impl->is_conj() != like.is_conj()) impl->_set_conj(like.is_conj());
  if (impl->is_neg() != like.is_neg()) impl->_set_neg(like.is_neg());
}

// A new owning reference to a storage that is alive.
c10::Storage held(c10::StorageImpl* storage) {
  return c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(storage));
}

}  // namespace

at::Tensor HostAliasSet::alias(const at::Tensor& device_tensor) {
  // A host view of device memory is read on this thread now: launched work that may write
  // it completes first (free when nothing is pending, and on stream workers).
  wait_for_device_work();
  const c10::Storage& device = device_tensor.unsafeGetTensorImpl()->unsafe_storage();
  c10::StorageImpl* device_storage = device.unsafeGetStorageImpl();
  c10::StorageImpl* host = host_storage_for(device_storage);
  if (host != nullptr) {
    at::Tensor result = tensor_on(held(host), c10::DispatchKey::CPU, device_tensor);
    created_.push_back(result);
    return result;
  }
  void* data = const_cast<void*>(device_storage->data());
  // Non-owning: the neuron storage keeps the memory alive for the whole op.
  c10::DataPtr view(data, c10::Device(c10::DeviceType::CPU));
  if (pool_ == nullptr) pool_ = &tls_alias_pool;
  if (!pool_->empty()) {
    at::Tensor recycled = std::move(pool_->back());
    pool_->pop_back();
    c10::StorageImpl* storage =
        recycled.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
    storage->set_data_ptr_noswap(std::move(view));
    if (storage->nbytes() != device_storage->nbytes())
      storage->set_nbytes(device_storage->nbytes());
    if (storage->resizable() != device_storage->resizable()) {
      storage->set_resizable(device_storage->resizable());
    }
    storages_.emplace_back(device, held(storage));
    retarget(recycled, device_tensor);
    created_.push_back(recycled);
    return recycled;
  }
  // A storage that cannot grow (shared memory) gets an alias that cannot either: a kernel
  // resizing it would otherwise hand the neuron storage private memory.
  c10::Storage storage = make_storage(device_storage->nbytes(), std::move(view),
                                      redirecting_cpu_allocator(), device_storage->resizable());
  storages_.emplace_back(device, storage);
  at::Tensor result = tensor_on(std::move(storage), c10::DispatchKey::CPU, device_tensor);
  created_.push_back(result);
  return result;
}

HostAliasSet::~HostAliasSet() {
  if (created_.empty()) return;
  pool_ = &tls_alias_pool;  // the destroying thread's pool
  for (at::Tensor& alias : created_) {
    // Recyclable when only this set holds the tensor, and its storage is held by the tensor
    // and this set's table alone (no other alias, view or result shares it). The pooled alias keeps
    // its non-owning pointer until reuse: nothing can reach it meanwhile.
    if (pool_->size() < kPoolSize && alias.use_count() == 1 &&
        alias.unsafeGetTensorImpl()->unsafe_storage().use_count() == 2) {
      pool_->push_back(std::move(alias));
    }
  }
}

c10::StorageImpl* HostAliasSet::device_storage_for(const c10::StorageImpl* host_storage) const {
  for (const auto& [device, host] : storages_) {
    if (host.unsafeGetStorageImpl() == host_storage) return device.unsafeGetStorageImpl();
  }
  return nullptr;
}

c10::StorageImpl* HostAliasSet::host_storage_for(const c10::StorageImpl* device_storage) const {
  for (const auto& [device, host] : storages_) {
    if (device.unsafeGetStorageImpl() == device_storage) return host.unsafeGetStorageImpl();
  }
  return nullptr;
}

at::Tensor device_tensor_on(c10::Storage storage, const at::Tensor& like) {
  return tensor_on(std::move(storage), c10::DispatchKey::PrivateUse1, like);
}

c10::Storage adopt_device_memory(c10::StorageImpl* host_storage, c10::DeviceIndex device) {
  if (!CachingAllocator::owns(host_storage->data_ptr())) return c10::Storage();
  const size_t nbytes = host_storage->nbytes();
  c10::DataPtr data = host_storage->set_data_ptr(c10::DataPtr());
  host_storage->set_nbytes(0);
  data.unsafe_set_device(c10::Device(c10::DeviceType::PrivateUse1, device));
  return make_storage(nbytes, std::move(data), &caching_allocator());
}

c10::Storage new_device_storage(size_t nbytes, c10::DeviceIndex device) {
  return make_storage(nbytes, caching_allocator().allocate_on(device, nbytes),
                      &caching_allocator());
}

at::Tensor ResultAdopter::adopt(at::Tensor host) {
  if (!host.defined() || !host.device().is_cpu()) return host;
  c10::StorageImpl* key = host.storage().unsafeGetStorageImpl();
  if (c10::StorageImpl* input = aliases_.device_storage_for(key)) {
    return device_tensor_on(held(input), host);  // a view of an argument
  }
  for (const auto& [seen, storage] : adopted_) {
    if (seen == key) return device_tensor_on(held(storage), host);
  }
  // (A storage without data, e.g. a zero tensor's, converts the same way.)
  if (host.use_count() == 1 && host.storage().use_count() == 1 &&
      (CachingAllocator::owns(key->data_ptr()) || key->data() == nullptr)) {
    // The common case: a fresh result nobody else holds, born in device memory. It turns
    // into a neuron tensor in place, without new tensor or storage objects.
    const c10::Device where(c10::DeviceType::PrivateUse1, device_);
    key->mutable_data_ptr().unsafe_set_device(where);
    auto* impl = host.unsafeGetTensorImpl();
    impl->set_storage_keep_dtype(host.storage());
    impl->_change_backend_component_keys(where);
    adopted_.emplace_back(key, key);
    return host;
  }
  const size_t nbytes = key->nbytes();
  c10::Storage storage = adopt_device_memory(key, device_);
  if (!storage) {
    storage = new_device_storage(0, device_);
    move_into(storage.unsafeGetStorageImpl(), key, nbytes);
  }
  adopted_.emplace_back(key, storage.unsafeGetStorageImpl());
  return device_tensor_on(std::move(storage), host);
}

void ResultAdopter::move_into(c10::StorageImpl* target, c10::StorageImpl* host, size_t nbytes) {
  c10::Storage adopted = adopt_device_memory(host, device_);
  if (adopted) {
    target->set_data_ptr_noswap(adopted.unsafeGetStorageImpl()->set_data_ptr(c10::DataPtr()));
  } else {
    c10::DataPtr fresh = caching_allocator().allocate_on(device_, nbytes);
    if (nbytes > 0 && host->data() != nullptr) {
      // The kernel produced memory that is not device memory: copy it in, and say so.
      std::memcpy(fresh.get(), host->data(), nbytes);
      if (counter_ != nullptr) counter_->fallback.fetch_add(1, std::memory_order_relaxed);
    }
    target->set_data_ptr_noswap(std::move(fresh));
  }
  target->set_nbytes(nbytes);
}

void ResultAdopter::write_back(const at::Tensor& device, const at::Tensor& host) {
  auto* impl = device.unsafeGetTensorImpl();
  c10::StorageImpl* device_storage = impl->storage().unsafeGetStorageImpl();
  c10::StorageImpl* host_storage = host.storage().unsafeGetStorageImpl();
  const c10::StorageImpl* stands_for = aliases_.device_storage_for(host_storage);
  if (stands_for == device_storage) {
    if (host_storage->data() != device_storage->data()) {
      // The kernel grew the alias's storage: the neuron storage, shared by every view of it,
      // takes over the new memory.
      move_into(device_storage, host_storage, host_storage->nbytes());
    }
  } else {
    // The kernel pointed the alias at other memory (set_): follow it.
    impl->set_storage_keep_dtype(adopt(host).storage());
  }
  if (device.sizes() != host.sizes() || device.strides() != host.strides() ||
      device.storage_offset() != host.storage_offset()) {
    impl->set_sizes_and_strides(host.sizes(), host.strides(), host.storage_offset());
  }
}

}  // namespace torchneuron
