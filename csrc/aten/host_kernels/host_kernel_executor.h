// The host-kernel contract, and the boxed executor that applies it to every op.
//
// A neuron op runs PyTorch's CPU kernel over device memory (it is host-addressable) in three
// steps: (1) alias: each neuron tensor is handed to the kernel as a CPU tensor over the same
// bytes; (2) run: the kernel runs with its allocations served from the op's device, so its
// results are born in device memory; (3) adopt: the results become neuron tensors again
// (in place when fresh, as views of the neuron argument when views of an alias, copied in
// and counted as a fallback when their memory came from elsewhere). HostKernelCall is that
// contract, written once; the boxed executor (host_kernel_executor.cpp), the typed host
// kernels, and the kernels of our own that hand cases back to the CPU all use it.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <utility>

#include "device/device_placement.h"
#include "memory/allocation_redirect.h"
#include "memory/host_alias.h"
#include "profiler/device_activity.h"

namespace torchneuron {

struct OpCounter;

// The OpenMP threads PyTorch's CPU kernels of device ops get on the calling thread (the
// worker's are the same, worker_intra_op_threads): 1 where the board covers the host's CPUs
// and launches are asynchronous, else the thread's count. A CPU reference of device results
// computed with this count runs the same kernels the same way.
int host_kernel_threads();

// While alive: the OpenMP threads of PyTorch's CPU kernels that a device op runs on the thread
// that called it (a copy to the host, an op that stays inline) are host_kernel_threads().
// libgomp keeps a team's idle threads spinning after each parallel region (GOMP_SPINCOUNT:
// 300,000 pauses, about 6 ms of a core on an Ice Lake guest), so a caller's two-thread copy
// left a thread spinning on the core that the stream's worker and the board's tasks needed
// next. Where the board covers the host's CPUs and a worker serves the device, such kernels
// run on one thread (the worker is idle meanwhile; kernels split over the board still use
// it); otherwise, and on the worker, the thread's count is left as it is.
class InlineKernelThreads {
 public:
  InlineKernelThreads();
  ~InlineKernelThreads();
  InlineKernelThreads(const InlineKernelThreads&) = delete;
  InlineKernelThreads& operator=(const InlineKernelThreads&) = delete;

 private:
  int saved_ = 0;  // the count to restore, or 0 if unchanged
};

// One call of a host kernel on `device`. Holds the call's aliases until the results are
// adopted; `counter` (may be null) is charged a fallback when a result must be copied in.
class HostKernelCall {
 public:
  HostKernelCall(c10::DeviceIndex device, OpCounter* counter)
      : device_(device), adopter_(aliases_, device, counter) {}
  HostKernelCall(const HostKernelCall&) = delete;
  HostKernelCall& operator=(const HostKernelCall&) = delete;

  c10::DeviceIndex device() const { return device_; }

  // (1) The CPU alias of a neuron tensor. Tensors sharing a neuron storage get aliases
  // sharing one host storage, so overlap checks and in-place views behave as on the CPU.
  at::Tensor alias(const at::Tensor& device_tensor) { return aliases_.alias(device_tensor); }
  // The host form of any tensor argument: a neuron tensor's alias, anything else as it is.
  at::Tensor to_host(const at::Tensor& t) { return is_device_tensor(t) ? alias(t) : t; }

  // (2) Runs `kernel` (the CPU kernel over the aliases) with its allocations served from the
  // device, recorded on the device timeline as `name` (a kernel or a copy).
  template <class Kernel>
  decltype(auto) run(const char* name, Kernel&& kernel,
                     DeviceActivityKind kind = DeviceActivityKind::kKernel) {
    const DeviceActivitySpan span(kind, name, device_);
    const DeviceAllocationScope scope(device_);
    const InlineKernelThreads threads;
    return std::forward<Kernel>(kernel)();
  }
  // The same without a span of its own, for callers that record the time themselves (or
  // whose work is not one kernel on the device timeline).
  template <class Kernel>
  decltype(auto) run_without_span(Kernel&& kernel) {
    const DeviceAllocationScope scope(device_);
    const InlineKernelThreads threads;
    return std::forward<Kernel>(kernel)();
  }

  // (3) A host result as a neuron tensor (see ResultAdopter::adopt).
  at::Tensor adopt(at::Tensor host) { return adopter_.adopt(std::move(host)); }
  // After an in-place or out= kernel: carries what the kernel did to the alias `host` over
  // to the neuron tensor it stands for.
  void write_back(const at::Tensor& device_tensor, const at::Tensor& host) {
    adopter_.write_back(device_tensor, host);
  }

 private:
  c10::DeviceIndex device_;
  HostAliasSet aliases_;
  ResultAdopter adopter_;  // reads aliases_: declared after it
};

// The boxed host-kernel executor (host_kernel_executor.cpp) as a callable, for kernels of
// our own that hand the cases they do not cover back to PyTorch's CPU kernels.
void run_on_host_kernels_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace torchneuron
