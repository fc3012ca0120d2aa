// Argument checks of the c10d backend "neuron": dtypes its collectives support, contiguous
// tensors on neuron or the CPU, one tensor per rank, matching lists and all_to_all splits.
#include "distributed/argument_checks.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/exception.h>

#include <algorithm>
#include <string>

#include "distributed/neuron_backend.h"
#include "launch/async_launch.h"

namespace torchneuron {

using nrt::dist::ElementType;

ElementType element_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return ElementType::kFloat32;
    case at::kDouble:
      return ElementType::kFloat64;
    case at::kBFloat16:
      return ElementType::kBFloat16;
    case at::kHalf:
      return ElementType::kFloat16;
    case at::kChar:
      return ElementType::kInt8;
    case at::kByte:
      return ElementType::kUInt8;
    case at::kInt:
      return ElementType::kInt32;
    case at::kLong:
      return ElementType::kInt64;
    case at::kBool:
      return ElementType::kBool;
    default:
      C10_THROW_ERROR(DistBackendError, std::string("neuron backend: dtype ") +
                                            c10::toString(t.scalar_type()) +
                                            " is not supported by its collectives");
  }
}

// The tensor's bytes, read and written in place: device memory is host-addressable.
void* host_bytes(const at::Tensor& t, const char* what) {
  if (!t.is_contiguous()) {
    C10_THROW_ERROR(DistBackendError, std::string("neuron backend: ") + what +
                                          " needs contiguous tensors; call .contiguous()");
  }
  if (!t.is_cpu() && t.device().type() != c10::DeviceType::PrivateUse1) {
    C10_THROW_ERROR(DistBackendError, std::string("neuron backend: ") + what + " got a tensor on " +
                                          t.device().str() + "; it takes neuron or CPU tensors");
  }
  wait_for_device_work();  // launched work that writes the tensor completes first
  return t.data_ptr();
}

at::Tensor& single(std::vector<at::Tensor>& tensors, const char* what) {
  if (tensors.size() != 1) {
    C10_THROW_ERROR(DistBackendError, std::string("neuron backend: ") + what +
                                          " takes one tensor per rank (one device per "
                                          "process), got " +
                                          std::to_string(tensors.size()));
  }
  return tensors[0];
}

c10::intrusive_ptr<c10d::Work> completed(std::vector<at::Tensor> outputs) {
  auto future =
      c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  future->markCompleted(c10::IValue(std::move(outputs)));
  return c10d::Work::create_from_future(future);
}

// Bytes per peer from split sizes along dim 0 (empty: equal splits).
std::vector<size_t> NeuronBackend::split_bytes(const at::Tensor& t,
                                               const std::vector<int64_t>& splits,
                                               const char* what) const {
  const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
  const size_t row_bytes = rows == 0 ? 0 : t.nbytes() / static_cast<size_t>(rows);
  std::vector<size_t> bytes(size_);
  if (splits.empty()) {
    if (rows % size_ != 0) {
      C10_THROW_ERROR(DistBackendError, std::string("neuron backend: all_to_all_single: ") +
                                            std::to_string(rows) +
                                            " rows do not split evenly over " +
                                            std::to_string(size_) + " ranks; pass " + what);
    }
    std::fill(bytes.begin(), bytes.end(), row_bytes * static_cast<size_t>(rows / size_));
    return bytes;
  }
  int64_t total = 0;
  for (int r = 0; r < size_ && r < static_cast<int>(splits.size()); ++r) total += splits[r];
  if (splits.size() != static_cast<size_t>(size_) || total != rows) {
    C10_THROW_ERROR(DistBackendError, std::string("neuron backend: all_to_all_single: ") + what +
                                          " must have world size entries summing to " +
                                          std::to_string(rows));
  }
  for (int r = 0; r < size_; ++r) bytes[r] = row_bytes * static_cast<size_t>(splits[r]);
  return bytes;
}

void NeuronBackend::check_pairs(const std::vector<at::Tensor>& outputs,
                                const std::vector<at::Tensor>& inputs, const char* what) {
  if (outputs.size() != inputs.size()) {
    C10_THROW_ERROR(DistBackendError,
                    std::string("neuron backend: ") + what + " needs as many outputs as inputs");
  }
}

}  // namespace torchneuron
