// Unboxed host kernels: what host_kernel_executor.cpp does for every op (the host-kernel
// contract of host_kernel_executor.h: alias the neuron arguments, run the CPU kernel with
// allocations redirected to the device, adopt the results), but with the op's C++ signature, so a
// call is not boxed into an IValue stack and unboxed again on the way to the CPU kernel.
// TypedHostKernel<Op>::run is the kernel; the registrations are in host_kernel_typed.cpp, and
// host_iterator_kernels.cpp falls back to it.
#pragma once

#include <ATen/Operators.h>
#include <c10/core/DeviceGuard.h>

#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "device/device_placement.h"
#include "host_kernels/host_kernel_executor.h"
#include "launch/async_launch.h"
#include "ops/op_tracking.h"

namespace torchneuron {

// The host form of a tensor list argument (cat, stack): owns the aliases and converts to
// the list reference the CPU kernel takes.
struct HostTensorList {
  std::vector<at::Tensor> tensors;
  operator at::ITensorListRef() const {
    return at::ITensorListRef(at::ArrayRef<at::Tensor>(tensors));
  }  // NOLINT
};

// One call's device and argument checks, and the host form of its arguments.
class TypedCall {
 public:
  explicit TypedCall(const char* op) : placement_(op) {}

  template <class T>
  void visit(const T& value) {
    using Plain = std::decay_t<T>;
    if constexpr (std::is_same_v<Plain, at::Tensor>) {
      visit_tensor(value);
    } else if constexpr (std::is_same_v<Plain, std::optional<at::Tensor>>) {
      if (value.has_value()) visit_tensor(*value);
    } else if constexpr (std::is_same_v<Plain, at::ITensorListRef>) {
      for (const at::Tensor& t : value) visit_tensor(t);
    }
  }

  // The host form of an argument: tensors become aliases; everything else passes through.
  template <class T>
  static decltype(auto) to_host(HostKernelCall& call, T&& value) {
    using Plain = std::decay_t<T>;
    if constexpr (std::is_same_v<Plain, at::Tensor>) {
      return call.to_host(value);
    } else if constexpr (std::is_same_v<Plain, std::optional<at::Tensor>>) {
      if (!value.has_value() || !is_device_tensor(*value)) return std::optional<at::Tensor>(value);
      return std::optional<at::Tensor>(call.alias(*value));
    } else if constexpr (std::is_same_v<Plain, at::ITensorListRef>) {
      HostTensorList list;
      list.tensors.reserve(value.size());
      for (const at::Tensor& t : value) list.tensors.push_back(call.to_host(t));
      return list;
    } else {
      return std::forward<T>(value);
    }
  }

  c10::DeviceIndex device() const { return placement_.device(); }

 private:
  void visit_tensor(const at::Tensor& t) { placement_.visit(t); }

  DevicePlacement placement_;
};

template <class T>
struct HostArg {
  using type = T;  // scalars, lists and options pass through by reference
};
template <>
struct HostArg<const at::Tensor&> {
  using type = at::Tensor;
};
template <>
struct HostArg<at::Tensor&> {
  using type = at::Tensor;
};
template <>
struct HostArg<const std::optional<at::Tensor>&> {
  using type = std::optional<at::Tensor>;
};
template <>
struct HostArg<const at::ITensorListRef&> {
  using type = HostTensorList;
};

template <class T>
struct TypeTag {
  using type = T;
};

template <class T>
struct IsTensorTuple : std::false_type {};
template <class... T>
struct IsTensorTuple<std::tuple<T...>> : std::conjunction<std::is_same<T, at::Tensor>...> {};

template <class Op, class Schema = typename Op::schema>
struct TypedHostKernel;

template <class Op, class Ret, class... Args>
struct TypedHostKernel<Op, Ret(Args...)> {
  static std::string name() {
    std::string result = Op::name;
    if (*Op::overload_name != '\0') result += std::string(".") + Op::overload_name;
    return result;
  }

  static Ret run(Args... args) {
    static OpCounter& counter = op_counter_named(name());
    TypedCall call(Op::name);
    (call.visit(args), ...);
    const c10::DeviceIndex device = call.device();
    if (async_candidate(tensor_bytes(args...))) {
      static const c10::OperatorHandle handle =
          c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
      if (auto results = launch_async_unboxed<Args...>(handle, device, args...)) {
        return from_stack(*results, args...);
      }
    }
    wait_for_device_work(counter);
    HostKernelCall host_call(device, &counter);
    std::tuple<typename HostArg<Args>::type...> host(TypedCall::to_host(host_call, args)...);
    if constexpr (std::is_same_v<Ret, at::Tensor&>) {
      // In place: the kernel writes through the alias; the neuron argument is the result.
      host_call.run(Op::name, [&host] {
        std::apply(
            [](auto&... a) { Op::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), a...); },
            host);
      });
      Ret result = write_back_mutable(host_call, host, std::index_sequence_for<Args...>{}, args...);
      counter.executed.fetch_add(1, std::memory_order_relaxed);
      return result;
    } else {
      static_assert(std::is_same_v<Ret, at::Tensor> || IsTensorTuple<Ret>::value,
                    "typed host kernels return a tensor, a tuple of tensors or a mutable tensor");
      Ret result = host_call.run(Op::name, [&host] {
        return std::apply(
            [](auto&... a) {
              return Op::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), a...);
            },
            host);
      });
      counter.executed.fetch_add(1, std::memory_order_relaxed);
      if constexpr (std::is_same_v<Ret, at::Tensor>) {
        return host_call.adopt(std::move(result));
      } else {
        return std::apply(
            [&host_call](auto&... t) { return Ret(host_call.adopt(std::move(t))...); }, result);
      }
    }
  }

  // The result of an asynchronous launch: the first mutable argument for an in-place op,
  // else the fresh results the launch left on the stack.
  static Ret from_stack(torch::jit::Stack& results, Args&... args) {
    if constexpr (std::is_same_v<Ret, at::Tensor&>) {
      at::Tensor* first = nullptr;
      auto pick = [&first](auto& value, auto tag) {
        if constexpr (std::is_same_v<typename decltype(tag)::type, at::Tensor&>) {
          if (first == nullptr) first = &value;
        }
      };
      (pick(args, TypeTag<Args>{}), ...);
      return *first;
    } else if constexpr (std::is_same_v<Ret, at::Tensor>) {
      return std::move(results[0]).toTensor();
    } else {
      return tuple_from(results, std::make_index_sequence<std::tuple_size_v<Ret>>{});
    }
  }

  template <size_t... I>
  static Ret tuple_from(torch::jit::Stack& results, std::index_sequence<I...>) {
    return Ret(std::move(results[I]).toTensor()...);
  }

  // Writes every mutable tensor argument's alias back and returns the first of them.
  template <class Tuple, size_t... I>
  static at::Tensor& write_back_mutable(HostKernelCall& call, Tuple& host,
                                        std::index_sequence<I...>, Args&... args) {
    at::Tensor* first = nullptr;
    auto visit = [&](auto& original, auto& alias) {
      if constexpr (std::is_same_v<std::remove_reference_t<decltype(original)>, at::Tensor>) {
        call.write_back(original, alias);
        if (first == nullptr) first = &original;
      }
    };
    (visit_if_mutable<Args>(visit, args, std::get<I>(host)), ...);
    return *first;
  }

  template <class Arg, class Visit, class Original, class Alias>
  static void visit_if_mutable(Visit& visit, Original& original, Alias& alias) {
    if constexpr (std::is_same_v<Arg, at::Tensor&>) visit(original, alias);
  }
};

}  // namespace torchneuron
