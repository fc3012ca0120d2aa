// Neuron storages grown in place and fresh device tensors for native kernels' results
// (device_storage.h).
#include "memory/device_storage.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>

#include "device/device_state.h"
#include "memory/caching_allocator.h"
#include "memory/host_alias.h"

namespace torchneuron {

void resize_device_storage(c10::StorageImpl* storage, size_t nbytes) {
  TORCH_CHECK(storage->resizable(),
              "Trying to resize a neuron storage that is not resizable (it is in shared "
              "memory, or wraps memory it does not own); clone the tensor first.");
  const c10::DeviceIndex device =
      storage->device().has_index() ? storage->device().index() : current_device();
  c10::DataPtr fresh = caching_allocator().allocate_on(device, nbytes);
  const size_t keep = std::min(nbytes, storage->nbytes());
  if (keep > 0) std::memcpy(fresh.get(), storage->data(), keep);
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(nbytes);
}

at::Tensor empty_device_tensor(c10::IntArrayRef sizes, const at::Tensor& like) {
  const size_t nbytes = at::detail::computeStorageNbytesContiguous(sizes, like.dtype().itemsize());
  at::Tensor result = at::detail::make_tensor<c10::TensorImpl>(
      new_device_storage(nbytes, like.device().index()),
      c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), like.dtype());
  // (As at::empty: a tensor of size [0] keeps the default geometry.)
  if (sizes.size() != 1 || sizes[0] != 0) result.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  return result;
}

}  // namespace torchneuron
