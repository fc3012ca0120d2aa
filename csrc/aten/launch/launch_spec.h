// What an op's results will be, for an asynchronous launch (async_launch.h): their sizes,
// strides and dtypes, from the op's meta kernel, asked once per thread and argument
// signature.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <memory>
#include <vector>

#include "launch/launch_plan.h"

namespace torchneuron {

// What the meta kernel said about one result tensor.
struct TensorSpec {
  bool defined = false;
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
  caffe2::TypeMeta dtype;
  size_t nbytes = 0;
};

// Per return: an argument returned as is (alias), one tensor, a list of them, or None.
struct ResultSpec {
  enum class Kind { kAlias, kTensor, kList, kNone } kind = Kind::kNone;
  std::vector<TensorSpec> tensors;
};

// An out= argument the op resizes: it arrives empty (no bytes) and the caller resizes it to
// `sizes` (contiguous) before the launch, so the kernel finds it sized and only writes it.
struct OutputResize {
  size_t argument = 0;
  std::vector<int64_t> sizes;
};

// An op's results for one argument signature, or the verdict that it runs inline.
struct LaunchSpec {
  bool inline_only = false;
  std::vector<ResultSpec> results;
  std::vector<OutputResize> resizes;
};

// The results of calling `op` with the arguments on `stack` (from `first`) on `device`, or a
// spec with inline_only when the call must run inline.
std::shared_ptr<const LaunchSpec> launch_spec_for(const c10::OperatorHandle& op, AsyncPlan& plan,
                                                  const torch::jit::Stack& stack, size_t first,
                                                  c10::DeviceIndex device);

// A neuron result of `spec`, allocated now on the calling thread's stream.
at::Tensor make_result(const TensorSpec& spec, c10::DeviceIndex device);

inline bool same_geometry(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && a.strides() == b.strides() &&
         a.storage_offset() == b.storage_offset();
}

}  // namespace torchneuron
