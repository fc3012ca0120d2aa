// The neuron kernels that cannot run as host kernels over aliases: tensor creation,
// views and metadata changes on the device tensor itself, copies across the host/device
// boundary, scalar reads, and dropout (which must draw from the neuron generator).
// Everything else goes through host_kernel_executor.cpp.
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/MemoryOverlap.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <algorithm>

#include "device/device_placement.h"
#include "device/device_state.h"
#include "host_kernels/host_iterator_kernels.h"
#include "host_kernels/host_kernel_executor.h"
#include "launch/async_launch.h"
#include "memory/caching_allocator.h"
#include "memory/device_storage.h"
#include "native/aten_parallel.h"
#include "op_registrations.h"
#include "ops/op_tracking.h"
#include "profiler/device_activity.h"

namespace torchneuron {
namespace {

constexpr auto kNeuronKeys = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);

void count(OpCounter& counter) { counter.executed.fetch_add(1, std::memory_order_relaxed); }

// From this size a copy between host views of one shape runs as two halves over the task
// board (the waiting caller and the idle worker): on the caller a host kernel has one OpenMP
// thread (InlineKernelThreads), and one thread copies 16-256 MiB at about half the rate of
// two (10 against 19 GB/s on an Ice Lake guest).
constexpr int64_t kSplitCopyFromBytes = int64_t{1} << 20;

// CPU copy_ of `src` into `dst` (host views), in two board tasks where that pays. Views of
// one storage, and a destination whose elements share memory (an expanded tensor), are
// copied whole: PyTorch refuses those overlaps in the whole copy, which two halves, each
// checked alone, could race past.
void host_copy(const at::Tensor& dst, const at::Tensor& src) {
  const auto copy = [](const at::Tensor& to, const at::Tensor& from) {
    at::_ops::copy_::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU),
                                const_cast<at::Tensor&>(to), from, false);
  };
  const int64_t bytes = dst.numel() * static_cast<int64_t>(dst.element_size());
  const auto dims = dst.sizes();
  const auto split = std::find_if(dims.begin(), dims.end(), [](int64_t n) { return n >= 2; });
  if (bytes < kSplitCopyFromBytes || dst.sizes() != src.sizes() || split == dims.end() ||
      dst.layout() != at::kStrided || src.layout() != at::kStrided || dst.is_alias_of(src) ||
      at::has_internal_overlap(dst) != at::MemOverlap::No ||
      !nrt::TaskBoard::instance().shares_here()) {
    copy(dst, src);
    return;
  }
  const int64_t dim = split - dims.begin(), size = *split;
  run_cpu_kernel_tasks(2, [&](int64_t half) {
    const int64_t begin = half * size / 2, end = (half + 1) * size / 2;
    copy(dst.narrow(dim, begin, end - begin), src.narrow(dim, begin, end - begin));
  });
}

c10::Device target_device(std::optional<c10::Device> device) {
  const c10::DeviceIndex index = device.has_value() && device->has_index() ? device->index() : -1;
  return c10::Device(c10::DeviceType::PrivateUse1, resolve_device_index(index));
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<at::ScalarType> dtype,
                               std::optional<at::Layout> layout, std::optional<at::Device> device,
                               std::optional<bool> pin_memory,
                               std::optional<at::MemoryFormat> memory_format) {
  static OpCounter& counter = op_counter_named("aten::empty.memory_format");
  count(counter);
  TORCH_CHECK(!pin_memory.value_or(false),
              "Only CPU tensors can be pinned; create the tensor "
              "on the CPU with pin_memory=True and copy it to neuron.");
  const c10::DeviceGuard guard(target_device(device));
  return at::detail::empty_generic(size, &caching_allocator(), kNeuronKeys,
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride,
                         std::optional<at::ScalarType> dtype, std::optional<at::Layout> layout,
                         std::optional<at::Device> device, std::optional<bool> pin_memory) {
  static OpCounter& counter = op_counter_named("aten::empty_strided");
  count(counter);
  const c10::DeviceGuard guard(target_device(device));
  return at::detail::empty_strided_generic(size, stride, &caching_allocator(), kNeuronKeys,
                                           c10::dtype_or_default(dtype));
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  static OpCounter& counter = op_counter_named("aten::as_strided");
  count(counter);
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, c10::IntArrayRef size) {
  static OpCounter& counter = op_counter_named("aten::view");
  count(counter);
  return at::native::view(self, size);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride) {
  static OpCounter& counter = op_counter_named("aten::_reshape_alias");
  count(counter);
  return at::native::_reshape_alias(self, size, stride);
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  static OpCounter& counter = op_counter_named("aten::resize_");
  count(counter);
  auto* impl = self.unsafeGetTensorImpl();
  // A failed resize (out of memory, a storage in shared memory) leaves the tensor as it was.
  const c10::SmallVector<int64_t, 5> old_sizes(self.sizes().begin(), self.sizes().end());
  const c10::SmallVector<int64_t, 5> old_strides(self.strides().begin(), self.strides().end());
  if (self.sizes() != size || memory_format.has_value()) {
    impl->set_sizes_contiguous(size);
    if (memory_format.has_value()) impl->empty_tensor_restride(*memory_format);
  }
  const size_t needed =
      at::detail::computeStorageNbytes(self.sizes(), self.strides(), self.dtype().itemsize(),
                                       static_cast<size_t>(self.storage_offset()));
  c10::StorageImpl* storage = impl->storage().unsafeGetStorageImpl();
  if (needed > storage->nbytes()) {
    // Launched work may still use the old memory (an empty storage has none to use).
    if (storage->nbytes() > 0) wait_for_device_work(counter);
    try {
      resize_device_storage(storage, needed);
    } catch (...) {
      impl->set_sizes_and_strides(old_sizes, old_strides);
      throw;
    }
  }
  return self;
}

at::Tensor& set_storage_offset(at::Tensor& self, at::Storage source, int64_t storage_offset,
                               c10::IntArrayRef size, c10::IntArrayRef stride) {
  static OpCounter& counter = op_counter_named("aten::set_");
  count(counter);
  TORCH_CHECK(source.device().type() == c10::DeviceType::PrivateUse1,
              "set_: expected a neuron storage for a neuron tensor, got one on ", source.device(),
              "; move the data with .to('neuron') first.");
  auto* impl = self.unsafeGetTensorImpl();
  if (impl->storage().unsafeGetStorageImpl() != source.unsafeGetStorageImpl()) {
    impl->set_storage_keep_dtype(std::move(source));
  }
  if (stride.empty()) {
    impl->set_sizes_contiguous(size);
    impl->set_storage_offset(storage_offset);
  } else {
    impl->set_sizes_and_strides(size, stride, storage_offset);
  }
  return self;
}

at::Tensor& set_storage(at::Tensor& self, at::Storage source) {
  const auto numel = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage_offset(self, std::move(source), 0, {numel}, {});
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.is_same(source)) return self;
  return set_storage_offset(self, source.storage(), source.storage_offset(), source.sizes(),
                            source.strides());
}

at::Tensor& set_empty(at::Tensor& self) {
  const c10::DeviceIndex device = self.device().index();
  return set_storage_offset(self, new_device_storage(0, device), 0, {0}, {});
}

// Copies between neuron and host tensors (or two neuron devices): both sides are
// host-addressable, so the host copy kernel does the dtype conversion and striding.
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool /*non_blocking*/) {
  static OpCounter& counter = op_counter_named("aten::_copy_from");
  count(counter);
  wait_for_device_work(counter);
  HostKernelCall call(is_device_tensor(dst) ? dst.device().index() : self.device().index(),
                      nullptr);
  const at::Tensor src_host = call.to_host(self);
  const at::Tensor dst_host = call.to_host(dst);
  call.run(
      memcpy_activity_name(is_device_tensor(self), is_device_tensor(dst)),
      [&] { host_copy(dst_host, src_host); }, DeviceActivityKind::kMemcpy);
  return dst;
}

// copy_ itself, for the same copies. PyTorch's generic copy_ would check its arguments,
// dispatch _copy_from, and the host copy_ there would check them again: running the host
// copy_ once over the aliases does the work once (half the cost of a small copy).
at::Tensor& copy_(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  if (self.is_same(src)) return self;
  // Into device memory it can run later; out of it, the host reads the values now, so
  // launched work completes first. A host source is snapshotted (one more copy), which only
  // pays while work is pending: otherwise the copy runs inline at once.
  if (is_device_tensor(self) && async_candidate(self.nbytes() + src.nbytes()) &&
      (is_device_tensor(src) || launched_work_pending())) {
    static const c10::OperatorHandle handle =
        c10::Dispatcher::singleton().findSchemaOrThrow("aten::copy_", "");
    if (launch_async_unboxed<at::Tensor&, const at::Tensor&, bool>(handle, self.device().index(),
                                                                   self, src, non_blocking)) {
      return self;
    }
  }
  static OpCounter& counter = op_counter_named("aten::copy_");
  wait_for_device_work(counter);
  count(counter);
  const c10::DeviceIndex device =
      is_device_tensor(self) ? self.device().index() : src.device().index();
  const DeviceActivitySpan span(DeviceActivityKind::kMemcpy,
                                memcpy_activity_name(is_device_tensor(src), is_device_tensor(self)),
                                device);
  if (copy_within_device(self, src)) return self;
  HostKernelCall call(device, nullptr);
  at::Tensor dst_host = call.to_host(self);
  const at::Tensor src_host = call.to_host(src);
  call.run_without_span([&] { host_copy(dst_host, src_host); });
  return self;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  if (dst.sizes() != self.sizes()) {
    if (is_device_tensor(dst)) {
      resize_(dst, self.sizes(), std::nullopt);
    } else {
      dst.resize_(self.sizes());
    }
  }
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  static OpCounter& counter = op_counter_named("aten::_local_scalar_dense");
  count(counter);
  wait_for_device_work(counter);
  // Only the alias step of the contract: reading a scalar allocates nothing and adopts nothing.
  HostKernelCall call(self.device().index(), nullptr);
  const DeviceActivitySpan span(DeviceActivityKind::kMemcpy, memcpy_activity_name(true, false),
                                call.device());
  return at::_local_scalar_dense(call.alias(self));
}

// CPU's native_dropout draws from the CPU generator (it has no generator argument); on
// neuron the mask must come from the device's generator, so it is drawn with bernoulli_.
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p,
                                                  std::optional<bool> train) {
  static OpCounter& counter = op_counter_named("aten::native_dropout");
  count(counter);
  if (input.numel() == 0) return {input, at::empty_like(input, input.options().dtype(at::kBool))};
  if (train.has_value() && !*train) {
    return {input.clone(), at::ones_like(input, input.options().dtype(at::kBool))};
  }
  const double keep = 1.0 - p;
  const double scale = keep == 0.0 ? 0.0 : 1.0 / keep;
  at::Tensor noise = at::empty_like(input, at::MemoryFormat::Contiguous);
  noise.bernoulli_(keep);
  at::Tensor output = input.mul(noise).mul_(scale);
  return {output, noise.to(at::kBool)};
}

// Marks the tensor's memory as in use by `stream`, so the allocator does not reuse it before
// that stream's work reaches the point where the tensor is freed.
void record_stream(at::Tensor& self, c10::Stream stream) {
  static OpCounter& counter = op_counter_named("aten::record_stream");
  count(counter);
  caching_allocator().recordStream(self.storage().data_ptr(), stream);
}

// histc of integer input: CUDA supports it (Transformers' grouped MoE routing relies on that
// on every device but CPU and MPS); the CPU kernel does not. Integers are counted exactly in
// float64 and the counts returned in the input's dtype, as CUDA does.
at::Tensor histc(const at::Tensor& self, int64_t bins, const at::Scalar& min,
                 const at::Scalar& max) {
  static OpCounter& counter = op_counter_named("aten::histc");
  count(counter);
  if (at::isIntegralType(self.scalar_type(), /*includeBool=*/true)) {
    return at::histc(self.to(at::kDouble), bins, min, max).to(self.scalar_type());
  }
  wait_for_device_work(counter);
  HostKernelCall call(self.device().index(), &counter);
  at::Tensor host_self = call.alias(self);
  at::Tensor result = call.run("aten::histc", [&] { return at::histc(host_self, bins, min, max); });
  return call.adopt(std::move(result));
}

// Whether `self.data = from` may keep `self`'s TensorImpl (and so its identity) while taking
// `from`'s storage and device. nn.Module.to() relies on it to move parameters in place:
// without it, every parameter is replaced by a new one and parameters shared between
// modules (tied input and output embeddings) stop being shared. As between CPU and CUDA,
// dense neuron and CPU tensors are interchangeable in this sense.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense_here = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided &&
           (t.device().is_cpu() || t.device().type() == c10::DeviceType::PrivateUse1);
  };
  return dense_here(self) && dense_here(from);
}

}  // namespace

void register_device_tensor_ops(torch::Library& m) {
  m.impl("_has_compatible_shallow_copy_type", TORCH_FN(has_compatible_shallow_copy_type));
  m.impl("empty.memory_format", TORCH_FN(empty_memory_format));
  m.impl("empty_strided", TORCH_FN(empty_strided));
  m.impl("as_strided", TORCH_FN(as_strided));
  m.impl("view", TORCH_FN(view));
  m.impl("_reshape_alias", TORCH_FN(reshape_alias));
  m.impl("resize_", TORCH_FN(resize_));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(set_storage_offset));
  m.impl("set_.source_Storage", TORCH_FN(set_storage));
  m.impl("set_.source_Tensor", TORCH_FN(set_tensor));
  m.impl("set_", TORCH_FN(set_empty));
  m.impl("_copy_from", TORCH_FN(copy_from));
  m.impl("copy_", TORCH_FN(copy_));
  m.impl("_copy_from_and_resize", TORCH_FN(copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
  m.impl("native_dropout", TORCH_FN(native_dropout));
  m.impl("record_stream", TORCH_FN(record_stream));
  m.impl("histc", TORCH_FN(histc));
}

// Copies resolve conjugate and negative bits themselves (the host copy kernel reads the
// aliases' bits); sending them through the conj/neg fallbacks would materialise the input
// with clone -> copy_ -> _copy_from and recurse without end.
void register_copy_fallthroughs(torch::Library& m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

}  // namespace torchneuron
