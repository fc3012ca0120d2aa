// Neuron storages: growing one in place (resize_, UntypedStorage.resize_), and fresh tensors
// for native kernels' results.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Storage.h>

namespace torchneuron {

// Reallocates the storage to nbytes on its device, keeping the common prefix of its bytes.
void resize_device_storage(c10::StorageImpl* storage, size_t nbytes);

// A contiguous neuron tensor of `sizes` with the dtype and device of `like`: what at::empty
// returns, straight from the caching allocator. A kernel's result on a tiny tensor would
// otherwise spend ~500 instructions on the dispatcher and a device guard.
at::Tensor empty_device_tensor(c10::IntArrayRef sizes, const at::Tensor& like);

}  // namespace torchneuron
