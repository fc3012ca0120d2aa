// Neuron storages in shared device memory (shared_storage.h): share_memory_() and the
// handles torch.multiprocessing passes between processes.
#include "memory/shared_storage.h"

#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>
#include <torch/csrc/Storage.h>

#include <cstring>

#include "device/device_state.h"
#include "device/runtime_status.h"
#include "memory/caching_allocator.h"

namespace torchneuron {
namespace {

// The DataPtr context of a shared storage. An empty storage has no memory (ptr null) but is
// still marked shared, as an empty CPU storage is after share_memory_().
struct SharedSegment {
  c10::DeviceIndex device;
  void* ptr;
  size_t nbytes;
};

void release_shared_segment(void* context) {
  auto* segment = static_cast<SharedSegment*>(context);
  if (segment->ptr != nullptr) {
    // In a child forked after initialisation the runtime refuses; the inherited mapping
    // then simply stays until the child exits.
    if (nrt_mem_free(segment->device, segment->ptr) == NRT_SUCCESS) {
      try {
        caching_allocator().count_external(segment->device, segment->nbytes, /*mapped=*/false);
      } catch (...) {  // a deleter must not throw; stats are all that is lost
      }
    }
  }
  delete segment;
}

// Memory from `allocate` (a runtime call filling ptr), owned by the returned DataPtr and
// counted in the device's stats. Gives cached blocks back once if the device is full.
template <typename Allocate>
c10::DataPtr map_segment(c10::DeviceIndex device, size_t nbytes, Allocate allocate) {
  void* ptr = nullptr;
  if (nbytes > 0) {
    nrt_status status = allocate(&ptr);
    if (status == NRT_OUT_OF_MEMORY) {
      caching_allocator().emptyCache();
      status = allocate(&ptr);
    }
    NEURON_CHECK(status);
    caching_allocator().count_external(device, nbytes, /*mapped=*/true);
  }
  return c10::DataPtr(ptr, new SharedSegment{device, ptr, nbytes}, &release_shared_segment,
                      c10::Device(c10::DeviceType::PrivateUse1, device));
}

void check_is_neuron(const c10::StorageImpl& storage, const char* what) {
  TORCH_CHECK_VALUE(storage.device_type() == c10::DeviceType::PrivateUse1, what,
                    ": expected a neuron storage, got one on ", storage.device());
}

}  // namespace

void share_device_storage(c10::StorageImpl* storage) {
  check_is_neuron(*storage, "share_memory_");
  if (is_shared_device_storage(*storage)) return;
  const c10::DeviceIndex device =
      storage->device().has_index() ? storage->device().index() : current_device();
  const size_t nbytes = storage->nbytes();
  // Work queued on the device's streams may still be writing the old bytes.
  if (nbytes > 0) NEURON_CHECK(nrt_device_synchronize(device));
  c10::DataPtr shared = map_segment(device, nbytes, [&](void** ptr) {
    int fd = -1;
    return nrt_mem_alloc_shared(device, nbytes, ptr, &fd);
  });
  if (nbytes > 0) std::memcpy(shared.get(), storage->data(), nbytes);
  storage->set_data_ptr_noswap(std::move(shared));
  storage->set_resizable(false);
}

bool is_shared_device_storage(const c10::StorageImpl& storage) {
  return storage.data_ptr().get_deleter() == &release_shared_segment;
}

int shared_storage_fd(const c10::StorageImpl& storage) {
  check_is_neuron(storage, "shared_storage_fd");
  TORCH_CHECK(is_shared_device_storage(storage),
              "this neuron storage is not in shared memory; call share_memory_() first");
  const auto* segment = static_cast<const SharedSegment*>(storage.data_ptr().get_context());
  TORCH_CHECK(segment->ptr != nullptr, "an empty shared neuron storage has no memory file");
  int fd = -1;
  NEURON_CHECK(nrt_mem_shared_fd(segment->device, segment->ptr, &fd));
  return fd;
}

c10::Storage storage_from_shared_fd(int fd, size_t nbytes, c10::DeviceIndex device) {
  check_device_index(device);
  c10::DataPtr data = map_segment(device, nbytes, [&](void** ptr) {
    int own_fd = -1;
    return nrt_mem_import_shared(device, fd, nbytes, ptr, &own_fd);
  });
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), nbytes, std::move(data), &caching_allocator(),
      /*resizable=*/false));
}

namespace {

c10::StorageImpl* unpack_storage(pybind11::handle object) {
  TORCH_CHECK_TYPE(THPStorage_Check(object.ptr()), "expected a torch.UntypedStorage, got ",
                   Py_TYPE(object.ptr())->tp_name);
  return THPStorage_Unpack(object.ptr()).unsafeGetStorageImpl();
}

}  // namespace

void register_shared_storage(pybind11::module_& m) {
  m.def("_share_storage",
        [](pybind11::handle storage) { share_device_storage(unpack_storage(storage)); });
  m.def("_is_shared_storage", [](pybind11::handle storage) {
    return is_shared_device_storage(*unpack_storage(storage));
  });
  m.def("_shared_storage_fd",
        [](pybind11::handle storage) { return shared_storage_fd(*unpack_storage(storage)); });
  m.def("_storage_from_shared_fd", [](int fd, size_t nbytes, int device) {
    return pybind11::reinterpret_steal<pybind11::object>(
        THPStorage_Wrap(storage_from_shared_fd(fd, nbytes, static_cast<c10::DeviceIndex>(device))));
  });
}

}  // namespace torchneuron
