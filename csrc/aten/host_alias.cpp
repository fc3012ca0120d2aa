#include "host_alias.h"

#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>

#include "allocation_redirect.h"
#include "caching_allocator.h"

namespace torchneuron {
namespace {

c10::Storage make_storage(size_t nbytes, c10::DataPtr data, c10::Allocator* allocator) {
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(),
                                                            nbytes, std::move(data), allocator,
                                                            /*resizable=*/true));
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

at::Tensor HostAliasSet::alias(const at::Tensor& device_tensor) {
  const c10::Storage& device_storage = device_tensor.storage();
  const c10::Storage* host = host_storage_for(device_storage.unsafeGetStorageImpl());
  if (host == nullptr) {
    void* data = const_cast<void*>(device_storage.data());
    // Non-owning: the neuron storage keeps the memory alive for the whole op.
    c10::Storage created =
        make_storage(device_storage.nbytes(), c10::DataPtr(data, c10::Device(c10::DeviceType::CPU)),
                     redirecting_cpu_allocator());
    storages_.emplace_back(device_storage, std::move(created));
    host = &storages_.back().second;
  }
  return tensor_on(*host, c10::DispatchKey::CPU, device_tensor);
}

const c10::Storage* HostAliasSet::device_storage_for(const c10::StorageImpl* host_storage) const {
  for (const auto& [device, host] : storages_) {
    if (host.unsafeGetStorageImpl() == host_storage) return &device;
  }
  return nullptr;
}

const c10::Storage* HostAliasSet::host_storage_for(const c10::StorageImpl* device_storage) const {
  for (const auto& [device, host] : storages_) {
    if (device.unsafeGetStorageImpl() == device_storage) return &host;
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

}  // namespace torchneuron
