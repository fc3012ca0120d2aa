#include "device_storage.h"

#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>

#include "caching_allocator.h"
#include "device_state.h"

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

}  // namespace torchneuron
