// Growing a neuron storage in place (resize_, UntypedStorage.resize_).
#pragma once

#include <c10/core/Storage.h>

namespace torchneuron {

// Reallocates the storage to nbytes on its device, keeping the common prefix of its bytes.
void resize_device_storage(c10::StorageImpl* storage, size_t nbytes);

}  // namespace torchneuron
