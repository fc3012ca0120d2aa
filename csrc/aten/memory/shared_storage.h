// Neuron storages in memory other processes can map: what torch.multiprocessing needs to pass
// a neuron tensor by reference (torchneuron/device/tensor_sharing.py). The memory is the runtime's
// shared device memory (nrt_mem_alloc_shared): a memory file whose descriptor is the handle.
#pragma once

#include <c10/core/Storage.h>
#include <pybind11/pybind11.h>

namespace torchneuron {

// Moves the storage's bytes into shared memory on its device and points the storage (so
// every tensor viewing it) there; a no-op when it is shared already. Like a CPU storage in
// shared memory, it can no longer be resized.
void share_device_storage(c10::StorageImpl* storage);

bool is_shared_device_storage(const c10::StorageImpl& storage);

// The memory file of a shared storage, owned by the storage (duplicate it to keep it).
int shared_storage_fd(const c10::StorageImpl& storage);

// A neuron storage on `device` over shared memory of nbytes received from another process
// (fd is duplicated, not taken).
c10::Storage storage_from_shared_fd(int fd, size_t nbytes, c10::DeviceIndex device);

// Adds `_share_storage`, `_is_shared_storage`, `_shared_storage_fd` and
// `_storage_from_shared_fd` to the extension module.
void register_shared_storage(pybind11::module_& m);

}  // namespace torchneuron
