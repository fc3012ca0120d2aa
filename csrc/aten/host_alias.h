// Host views of device memory. The software NeuronCore's memory is host-addressable, so a
// neuron tensor can be handed to a host kernel as a CPU tensor over the very same bytes,
// and a CPU result whose bytes came from device memory can become a neuron tensor as is.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/SmallVector.h>

#include <utility>
#include <vector>

namespace torchneuron {

// One op's aliases: tensors that share a neuron storage get CPU aliases that share one
// storage too, so host kernels see the same aliasing (overlap checks, in-place views).
class HostAliasSet {
 public:
  at::Tensor alias(const at::Tensor& device_tensor);
  // The neuron storage a host storage of this set stands for, or null.
  const c10::Storage* device_storage_for(const c10::StorageImpl* host_storage) const;
  const c10::Storage* host_storage_for(const c10::StorageImpl* device_storage) const;

 private:
  c10::SmallVector<std::pair<c10::Storage, c10::Storage>, 4> storages_;  // (device, host)
};

// A neuron tensor with `storage` and the geometry (and conj/neg bits) of `like`.
at::Tensor device_tensor_on(c10::Storage storage, const at::Tensor& like);

// Moves the memory of a host storage that was allocated from device memory into a new
// neuron storage on `device`. Returns an undefined storage if the memory is not ours.
c10::Storage adopt_device_memory(c10::StorageImpl* host_storage, c10::DeviceIndex device);

// A new, empty-geometry neuron storage of nbytes on `device`.
c10::Storage new_device_storage(size_t nbytes, c10::DeviceIndex device);

}  // namespace torchneuron
