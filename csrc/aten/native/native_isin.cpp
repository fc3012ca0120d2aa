// torch.isin(elements, test_elements) for integer neuron tensors (token ids against a few
// special tokens: Transformers' min_length, min_new_tokens and suppress_tokens processors
// call it on the whole vocabulary every generation step) on csrc/kernels/membership.h, where
// PyTorch's CPU kernel spent ~9 ns an element. Other calls (other or mixed dtypes,
// non-contiguous or host tensors) take the host kernel, whose behaviour and errors are CPU
// eager's. Launched on its stream as any other op (launch_or_wait).
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <atomic>

#include "device/device_placement.h"
#include "host_kernels/host_kernel_typed.h"
#include "launch/async_launch.h"
#include "membership.h"
#include "native/native_kernel_switch.h"
#include "op_registrations.h"
#include "profiler/device_activity.h"

namespace torchneuron {
namespace {

bool native_isin(const at::Tensor& elements, const at::Tensor& tests) {
  const at::ScalarType dtype = elements.scalar_type();
  return native_kernels_enabled() && is_device_tensor(elements) && is_device_tensor(tests) &&
         elements.device() == tests.device() && (dtype == at::kLong || dtype == at::kInt) &&
         tests.scalar_type() == dtype && elements.is_contiguous() && tests.is_contiguous();
}

template <class T>
void run_isin(const at::Tensor& elements, const at::Tensor& tests, bool invert,
              at::Tensor& result) {
  neuron::kernels::isin(elements.const_data_ptr<T>(), elements.numel(), tests.const_data_ptr<T>(),
                        tests.numel(), invert, result.mutable_data_ptr<bool>());
}

at::Tensor isin(const at::Tensor& elements, const at::Tensor& tests, bool assume_unique,
                bool invert) {
  using Op = at::_ops::isin_Tensor_Tensor;
  if (!native_isin(elements, tests)) {
    return TypedHostKernel<Op>::run(elements, tests, assume_unique, invert);
  }
  if (auto launched = launch_or_wait<Op>(elements, tests, assume_unique, invert)) {
    return *launched;
  }
  static OpCounter& counter = op_counter_named("aten::isin.Tensor_Tensor");
  static std::atomic<uint64_t>& runs = native_kernel_counter("aten::isin.Tensor_Tensor");
  at::Tensor result = at::empty(elements.sizes(), elements.options().dtype(at::kBool));
  {
    const DeviceActivitySpan span(DeviceActivityKind::kKernel, Op::name, elements.device().index());
    if (elements.scalar_type() == at::kLong) {
      run_isin<int64_t>(elements, tests, invert, result);
    } else {
      run_isin<int32_t>(elements, tests, invert, result);
    }
  }
  counter.executed.fetch_add(1, std::memory_order_relaxed);
  runs.fetch_add(1, std::memory_order_relaxed);
  return result;
}

}  // namespace

void register_native_isin(torch::Library& m) { m.impl("isin.Tensor_Tensor", TORCH_FN(isin)); }

}  // namespace torchneuron
