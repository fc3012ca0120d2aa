// Gathers and joins that are plain byte copies between device buffers:
//  - index_select along the first dimension of a contiguous tensor (embedding lookups), and
//    x[rows] with one integer index tensor (aten::index);
//  - cat of contiguous tensors of one dtype (KV-cache appends, rotary halves).
// Through host aliases of every argument and the result (the typed host kernel; the boxed
// executor for aten::index) a small call cost 1.12x (index_select), 1.25x (index) and
// 1.19x (cat) CPU eager's instructions (benchmarks/dispatch_instructions.py). Every other
// call (another dim, strided or mixed-dtype inputs, int32, boolean or host indices, several
// index tensors, joins over 1 MiB) takes those kernels, whose behaviour and errors are CPU
// eager's; the checks here raise CPU eager's messages for what they reject. A call these
// kernels take is launched on its stream as any other (launch_or_wait) and copied there.
#include <ATen/WrapDimUtils.h>
#include <ATen/native/CPUFallback.h>
#include <torch/library.h>

#include <atomic>
#include <cstring>
#include <optional>

#include "host_kernels/host_kernel_executor.h"
#include "host_kernels/host_kernel_typed.h"
#include "memory/device_storage.h"
#include "native/native_kernel_switch.h"
#include "op_registrations.h"
#include "profiler/device_activity.h"

namespace torchneuron {
namespace {

// A table a gather reads: a contiguous, non-empty neuron tensor, selected along dim 0 by a
// contiguous int64 neuron tensor on the same device.
bool gathers_rows(const at::Tensor& self, const at::Tensor& index) {
  return is_device_tensor(self) && is_device_tensor(index) && self.device() == index.device() &&
         self.dim() >= 1 && self.numel() > 0 && self.is_contiguous() && !self.is_conj() &&
         !self.is_neg() && index.scalar_type() == at::kLong && index.is_contiguous();
}

enum class Bounds {
  kIndexSelect,  // non-negative indices: "index out of range in self"
  kIndexing,     // Python-style indices, negative ones from the end
};

// The rows of `self` that `index` picks, as a tensor of `sizes` (index's count of rows).
// Launched work was waited for (launch_or_wait).
at::Tensor gather_rows(const at::Tensor& self, const at::Tensor& index, c10::IntArrayRef sizes,
                       Bounds bounds, const char* op, OpCounter& counter,
                       std::atomic<uint64_t>& runs) {
  at::Tensor result = empty_device_tensor(sizes, self);
  {
    const DeviceActivitySpan span(DeviceActivityKind::kKernel, op, self.device().index());
    const int64_t rows = self.size(0);
    const size_t row_bytes = static_cast<size_t>(self.numel() / rows) * self.dtype().itemsize();
    const auto* table = static_cast<const char*>(self.const_data_ptr());
    auto* out = static_cast<char*>(result.mutable_data_ptr());
    const int64_t* picks = index.const_data_ptr<int64_t>();
    for (int64_t i = 0, count = index.numel(); i < count; ++i) {
      int64_t row = picks[i];
      if (bounds == Bounds::kIndexSelect) {
        TORCH_CHECK_INDEX(row >= 0 && row < rows, "index out of range in self");
      } else {
        TORCH_CHECK_INDEX(row >= -rows && row < rows, "index ", row,
                          " is out of bounds for dimension 0 with size ", rows);
        if (row < 0) row += rows;
      }
      std::memcpy(out + static_cast<size_t>(i) * row_bytes,
                  table + static_cast<size_t>(row) * row_bytes, row_bytes);
    }
  }
  counter.executed.fetch_add(1, std::memory_order_relaxed);
  runs.fetch_add(1, std::memory_order_relaxed);
  return result;
}

at::Tensor index_select(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  using Op = at::_ops::index_select;
  if (!gathers_rows(self, index) || index.dim() > 1 || at::maybe_wrap_dim(dim, self.dim()) != 0) {
    return TypedHostKernel<Op>::run(self, dim, index);
  }
  if (auto launched = launch_or_wait<Op>(self, dim, index)) return *launched;
  static OpCounter& counter = op_counter_named("aten::index_select");
  static std::atomic<uint64_t>& runs = native_kernel_counter("aten::index_select");
  c10::DimVector sizes(self.sizes().begin(), self.sizes().end());
  sizes[0] = index.numel();
  return gather_rows(self, index, sizes, Bounds::kIndexSelect, Op::name, counter, runs);
}

// x[rows] with one integer tensor: the rows it picks, shaped index.shape + x.shape[1:].
at::Tensor index(const at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices) {
  using Op = at::_ops::index_Tensor;
  const std::optional<at::Tensor> first =
      indices.size() == 1 ? indices.get(0) : std::optional<at::Tensor>();
  if (!first.has_value() || !gathers_rows(self, *first)) {
    return at::native::call_fallback_fn<&run_on_host_kernels_boxed, Op>::call(self, indices);
  }
  if (auto launched = launch_or_wait<Op>(self, indices)) return *launched;
  static OpCounter& counter = op_counter_named("aten::index.Tensor");
  static std::atomic<uint64_t>& runs = native_kernel_counter("aten::index.Tensor");
  c10::DimVector sizes(first->sizes().begin(), first->sizes().end());
  sizes.append(self.sizes().begin() + 1, self.sizes().end());
  return gather_rows(self, *first, sizes, Bounds::kIndexing, Op::name, counter, runs);
}

// Joins copied here: at most this many bytes. A larger join runs on the typed host kernel,
// whose copies are split across the intra-op threads.
constexpr size_t kMaxJoinBytes = size_t{1} << 20;

// The dimension a join this kernel copies runs along (`dim` wrapped), or nullopt. Its inputs:
// contiguous neuron tensors on one device, of one dtype and rank >= 1, sizes equal except
// along `dim` (in range), row-major (the CPU's result is then contiguous too), at most
// kMaxJoinBytes in all.
std::optional<int64_t> joined_axis(const at::ITensorListRef& tensors, int64_t dim) {
  if (tensors.size() == 0) return std::nullopt;
  const at::Tensor& first = *tensors.begin();
  const int64_t rank = first.dim();
  if (!is_device_tensor(first) || rank == 0 || dim < -rank || dim >= rank) return std::nullopt;
  const int64_t axis = dim < 0 ? dim + rank : dim;
  size_t bytes = 0;
  for (const at::Tensor& t : tensors) {
    if (!is_device_tensor(t) || t.device() != first.device() ||
        t.scalar_type() != first.scalar_type() || t.dim() != rank || !t.is_contiguous() ||
        t.is_conj() || t.is_neg() || t.suggest_memory_format() != at::MemoryFormat::Contiguous) {
      return std::nullopt;
    }
    for (int64_t d = 0; d < rank; ++d) {
      if (d != axis && t.size(d) != first.size(d)) return std::nullopt;
    }
    bytes += t.nbytes();
  }
  if (bytes > kMaxJoinBytes) return std::nullopt;
  return axis;
}

at::Tensor cat(const at::ITensorListRef& tensors, int64_t dim) {
  using Op = at::_ops::cat;
  const std::optional<int64_t> joined = joined_axis(tensors, dim);
  if (!joined) return TypedHostKernel<Op>::run(tensors, dim);
  if (auto launched = launch_or_wait<Op>(tensors, dim)) return *launched;
  static OpCounter& counter = op_counter_named("aten::cat");
  static std::atomic<uint64_t>& runs = native_kernel_counter("aten::cat");
  const at::Tensor& first = *tensors.begin();
  const int64_t axis = *joined;
  c10::DimVector sizes(first.sizes().begin(), first.sizes().end());
  sizes[axis] = 0;
  for (const at::Tensor& t : tensors) sizes[axis] += t.size(axis);
  at::Tensor result = empty_device_tensor(sizes, first);
  {
    const DeviceActivitySpan span(DeviceActivityKind::kKernel, Op::name, first.device().index());
    // Row-major: each input is `outer` blocks of its size(axis) * inner elements, and the
    // result's block o is the inputs' blocks o side by side.
    int64_t outer = 1;
    for (int64_t d = 0; d < axis; ++d) outer *= sizes[d];
    const size_t out_block = outer > 0 ? static_cast<size_t>(result.nbytes() / outer) : 0;
    auto* out = static_cast<char*>(result.mutable_data_ptr());
    size_t offset = 0;
    for (const at::Tensor& t : tensors) {
      const size_t block = outer > 0 ? static_cast<size_t>(t.nbytes() / outer) : 0;
      const auto* in = static_cast<const char*>(t.const_data_ptr());
      for (int64_t o = 0; o < outer && block > 0; ++o) {
        std::memcpy(out + static_cast<size_t>(o) * out_block + offset,
                    in + static_cast<size_t>(o) * block, block);
      }
      offset += block;
    }
  }
  counter.executed.fetch_add(1, std::memory_order_relaxed);
  runs.fetch_add(1, std::memory_order_relaxed);
  return result;
}

}  // namespace

void register_native_gather_ops(torch::Library& m) {
  m.impl("index_select", TORCH_FN(index_select));
  m.impl("index.Tensor", TORCH_FN(index));
  m.impl("cat", TORCH_FN(cat));
}

}  // namespace torchneuron
