// Asynchronous launches. By default a neuron op whose results' shapes do not depend on data
// is launched on its stream's worker (csrc/runtime/stream.h) and returns at once, so Python
// and dispatch overlap with compute, as on the device:
//  - the calling thread runs the op's meta kernel for its results' shapes, dtypes and
//    strides, allocates them, and enqueues the op over snapshots of its arguments;
//  - the worker runs the same neuron kernel inline; allocations of the results' sizes
//    there are served from the results' memory (ReservedAllocations), so a kernel that
//    allocates its own result writes it in place;
//  - every kernel that touches device memory on the calling thread first waits for the
//    launched work (wait_for_device_work), which also raises an error the work hit.
// NEURON_LAUNCH_BLOCKING=1 turns all of this off: every op runs on the calling thread.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/boxing/impl/boxing.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <utility>

#include "ops/op_tracking.h"

namespace torchneuron {

// Ops launch asynchronously (NEURON_LAUNCH_BLOCKING is not 1); read once per process.
bool async_launches();
// True while this thread runs launched work (a stream worker): kernels run inline there.
bool on_stream_worker();
// Waits until all launched work has completed and raises the first error it hit, naming
// the op. Costs one atomic load when nothing is pending; does nothing on a stream worker.
// True when there was launched work to wait for.
bool wait_for_device_work();
// The same for the kernel of the op `counter` counts: when it waited, the op is counted as
// synchronizing (torch.neuron.get_synchronizing_ops()).
void wait_for_device_work(OpCounter& counter);
// While alive, a thread that holds Python's GIL has released it: launched work may need it
// (dropping the last reference to a tensor that Python once saw), so a thread that waits
// for that work while holding it would wait forever.
class WaitingWithoutGil {
 public:
  WaitingWithoutGil();
  ~WaitingWithoutGil();
  WaitingWithoutGil(const WaitingWithoutGil&) = delete;
  WaitingWithoutGil& operator=(const WaitingWithoutGil&) = delete;

 private:
  void* saved_ = nullptr;  // PyThreadState*
};

// Whether launched work has not completed yet (free blocks may still be read by it).
bool launched_work_pending();

// Raises (once) the first error launched work hit since the last call, if any.
void raise_launch_error();

// Whether an op with `argument_bytes` of tensor arguments should try launching
// asynchronously: launches are asynchronous, this is not a worker, and work is already
// pending or the op is large enough (TORCHNEURON_ASYNC_MIN_BYTES, default 256 KiB) to repay
// the meta kernel and the hand-off, and no memory profile is recording on this thread.
bool async_candidate(size_t argument_bytes);

// Launches `op` (arguments on `stack`, as a boxed kernel gets them) on the current stream of
// `device` and replaces the arguments by its results. False, with the stack untouched, when
// the op cannot run asynchronously (data-dependent shapes, random numbers, host tensors,
// results that alias arguments, a meta kernel that fails, ...): the caller then waits for
// launched work and runs the op inline. Bit i of `borrowed` marks argument i as a borrowed
// tensor (BorrowedArguments), which a successful launch releases instead of destroying.
bool launch_async(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DeviceIndex device,
                  uint64_t borrowed = 0);

// A typed kernel's arguments as a stack, tensors borrowed: their IValues hold no reference
// of their own. Copying a tensor that Python owns changes its reference count through the
// Python object, which takes the GIL (PyTorch's bindings release it around an op): two such
// copies and releases cost a launch ~2,300 instructions and GIL traffic with the worker.
// Whatever borrowed entries are still on the stack at destruction are released unowned.
class BorrowedArguments {
 public:
  template <class... Args>
  explicit BorrowedArguments(const Args&... args) {
    stack_.reserve(sizeof...(Args));
    (push(args), ...);
  }
  ~BorrowedArguments() {
    for (size_t i = 0; i < stack_.size() && i < 64; ++i) {
      if ((mask_ >> i) & 1) c10::MaybeOwnedTraits<c10::IValue>::destroyBorrow(stack_[i]);
    }
  }
  BorrowedArguments(const BorrowedArguments&) = delete;
  BorrowedArguments& operator=(const BorrowedArguments&) = delete;

  torch::jit::Stack& stack() { return stack_; }
  uint64_t mask() const { return mask_; }
  // After a successful launch the stack holds results, none borrowed.
  void launched() { mask_ = 0; }

 private:
  template <class T>
  void push(const T& value) {
    if constexpr (std::is_same_v<T, at::Tensor>) {
      if (stack_.size() < 64) {
        mask_ |= uint64_t{1} << stack_.size();
        stack_.emplace_back(c10::MaybeOwnedTraits<at::Tensor>::createBorrow(value));
        return;
      }
    }
    torch::jit::push(stack_, value);
  }

  torch::jit::Stack stack_;
  uint64_t mask_ = 0;
};

// The bytes of an op's tensor arguments (for async_candidate).
template <class... Args>
size_t tensor_bytes(const Args&... args) {
  size_t total = 0;
  auto add = [&total](const auto& value) {
    using Plain = std::decay_t<decltype(value)>;
    if constexpr (std::is_same_v<Plain, at::Tensor>) {
      if (value.defined()) total += value.nbytes();
    } else if constexpr (std::is_same_v<Plain, std::optional<at::Tensor>>) {
      if (value.has_value() && value->defined()) total += value->nbytes();
    } else if constexpr (std::is_same_v<Plain, at::ITensorListRef>) {
      for (const at::Tensor& t : value) total += t.nbytes();
    }
  };
  (add(args), ...);
  return total;
}

// launch_async for a typed (unboxed) kernel: its results as a stack, or nullopt.
template <class... Args>
std::optional<torch::jit::Stack> launch_async_unboxed(const c10::OperatorHandle& op,
                                                      c10::DeviceIndex device,
                                                      const Args&... args) {
  BorrowedArguments arguments(args...);
  if (!launch_async(op, &arguments.stack(), device, arguments.mask())) return std::nullopt;
  arguments.launched();
  return std::move(arguments.stack());
}

// The index of the first neuron tensor argument (or tensor in a list argument), or -1.
template <class... Args>
c10::DeviceIndex first_device(const Args&... args) {
  c10::DeviceIndex device = -1;
  auto look_at = [&device](const at::Tensor& t) {
    if (device < 0 && t.defined() && t.device().type() == c10::DeviceType::PrivateUse1) {
      device = t.device().index();
    }
  };
  auto look = [&look_at](const auto& value) {
    using Plain = std::decay_t<decltype(value)>;
    if constexpr (std::is_same_v<Plain, at::Tensor>) {
      look_at(value);
    } else if constexpr (std::is_same_v<Plain, at::ITensorListRef>) {
      for (const at::Tensor& t : value) look_at(t);
    }
  };
  (look(args), ...);
  return device;
}

// At the top of a neuron kernel (at::_ops::<op> `Op`): launches the call asynchronously when
// it can and returns its results as a stack; otherwise waits for launched work and returns
// nullopt, and the kernel runs inline.
template <class Op, class... Args>
std::optional<torch::jit::Stack> launch_results_or_wait(const Args&... args) {
  const c10::DeviceIndex device = first_device(args...);
  if (device >= 0 && async_candidate(tensor_bytes(args...))) {
    static const c10::OperatorHandle handle =
        c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
    if (auto results = launch_async_unboxed<const Args&...>(handle, device, args...)) {
      return results;
    }
  }
  static OpCounter& counter = op_counter_named(Op::name);
  wait_for_device_work(counter);
  return std::nullopt;
}

// launch_results_or_wait for a kernel with one tensor result.
template <class Op, class... Args>
std::optional<at::Tensor> launch_or_wait(const Args&... args) {
  auto results = launch_results_or_wait<Op>(args...);
  if (!results) return std::nullopt;
  return std::move((*results)[0]).toTensor();
}

}  // namespace torchneuron
