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
  // A thread's recyclable alias objects.
  static constexpr size_t kPoolSize = 16;
  using Pool = c10::SmallVector<at::Tensor, kPoolSize>;

  HostAliasSet() = default;
  HostAliasSet(const HostAliasSet&) = delete;
  HostAliasSet& operator=(const HostAliasSet&) = delete;
  // Hands alias objects nobody else holds back to this thread's pool for the next op.
  ~HostAliasSet();

  at::Tensor alias(const at::Tensor& device_tensor);
  // The neuron storage a host storage of this set stands for, or null.
  c10::StorageImpl* device_storage_for(const c10::StorageImpl* host_storage) const;
  c10::StorageImpl* host_storage_for(const c10::StorageImpl* device_storage) const;

 private:
  // (device, host) storages, owned: a boxed caller's stack may have held the last reference
  // to an argument, which the executor replaces by its alias.
  c10::SmallVector<std::pair<c10::Storage, c10::Storage>, 4> storages_;
  c10::SmallVector<at::Tensor, 4> created_;  // aliases made by this set, for recycling
  // This thread's pool of recyclable aliases, looked up once per set (a TLS access each).
  Pool* pool_ = nullptr;
};

struct OpCounter;

// Turns the results of a host kernel run over a HostAliasSet into neuron tensors.
class ResultAdopter {
 public:
  // counter (may be null) is charged a fallback when a result must be copied in.
  ResultAdopter(const HostAliasSet& aliases, c10::DeviceIndex device, OpCounter* counter)
      : aliases_(aliases), device_(device), counter_(counter) {}

  // A fresh result becomes a neuron tensor in place when nobody else holds it; a view of
  // an argument becomes a view of the neuron argument; other memory is adopted or copied.
  at::Tensor adopt(at::Tensor host);
  // After an in-place or out= kernel: carries a reallocation, re-pointing or reshape of the
  // alias `host` over to the neuron tensor `device` it stands for.
  void write_back(const at::Tensor& device, const at::Tensor& host);

 private:
  // Gives `target` (a neuron storage) the memory of `host` (a host kernel's storage):
  // moved if it is device memory, else copied and counted as a fallback.
  void move_into(c10::StorageImpl* target, c10::StorageImpl* host, size_t nbytes);

  const HostAliasSet& aliases_;
  c10::DeviceIndex device_;
  OpCounter* counter_;
  // (host storage, neuron storage) of results adopted so far; the results hold both.
  c10::SmallVector<std::pair<c10::StorageImpl*, c10::StorageImpl*>, 4> adopted_;
};

// A neuron tensor with `storage` and the geometry (and conj/neg bits) of `like`.
at::Tensor device_tensor_on(c10::Storage storage, const at::Tensor& like);

// Moves the memory of a host storage that was allocated from device memory into a new
// neuron storage on `device`. Returns an undefined storage if the memory is not ours.
c10::Storage adopt_device_memory(c10::StorageImpl* host_storage, c10::DeviceIndex device);

// A new, empty-geometry neuron storage of nbytes on `device`.
c10::Storage new_device_storage(size_t nbytes, c10::DeviceIndex device);

}  // namespace torchneuron
