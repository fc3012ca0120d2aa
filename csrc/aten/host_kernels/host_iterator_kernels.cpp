// Elementwise kernels that hand a TensorIterator over neuron tensors straight to PyTorch's
// CPU loop (its DispatchStub, which picks the host's instructions at run time). Device memory
// is host-addressable, so the loop reads and writes it as is: no host aliases of the
// arguments, no result to adopt, one dispatch less. On tiny tensors that overhead was what
// made these ops cost 1.15-1.2x CPU eager's instructions (benchmarks/dispatch_instructions.py).
//
// Only the plain case runs here: every tensor a neuron tensor on one device, of one floating
// dtype. There the iterator casts nothing (its casts and CPU-scalar handling assume a CPU or
// CUDA common device), and the op's CPU meta function does nothing but build the iterator.
// Every other call (other dtypes, CPU scalars, broadcasting into an in-place output) takes
// the typed host kernel, whose behaviour and errors are CPU eager's. So does a call that
// launches on its stream; the worker then runs it here.

// A DispatchStub call compiles against the set of CPU capabilities libtorch_cpu was built
// with (its symbols take one kernel pointer per capability); PyTorch's x86-64 wheels are
// built with AVX2 and AVX-512 kernels.
#if defined(__x86_64__) || defined(_M_X64)
#define HAVE_AVX2_CPU_DEFINITION
#define HAVE_AVX512_CPU_DEFINITION
#endif
#include "host_kernels/host_iterator_kernels.h"

#include <ATen/ExpandUtils.h>
#include <ATen/TensorIterator.h>
#include <ATen/native/BinaryOps.h>
#include <ATen/native/Copy.h>
#include <ATen/native/TensorCompare.h>
#include <ATen/native/UnaryOps.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <atomic>
#include <optional>
#include <string>

#include "device/device_state.h"
#include "host_kernels/host_kernel_typed.h"
#include "memory/caching_allocator.h"
#include "native/native_kernel_switch.h"
#include "op_registrations.h"

namespace torchneuron {
namespace {

constexpr auto kNeuronKeys = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1);

// A TensorIterator whose missing outputs become neuron tensors on `device`, allocated as
// the CPU functional kernel would allocate its own (same sizes, strides, memory format).
class DeviceIterator final : public at::TensorIteratorBase {
 public:
  explicit DeviceIterator(c10::DeviceIndex device) : device_(device) {}

  c10::DeviceIndex device() const { return device_; }

  const at::Tensor& maybe_get_output(int64_t index) override { return operands_[index].tensor(); }

  void set_output_raw_strided(int64_t index, c10::IntArrayRef sizes, c10::IntArrayRef strides,
                              c10::TensorOptions options) override {
    at::OperandInfo& op = operands_[index];
    if (op.tensor_base().defined()) {
      // In place: the callers admit only outputs of the broadcast shape.
      TORCH_INTERNAL_ASSERT(!op.will_resize, "neuron: an in-place output would be resized");
      return;
    }
    std::optional<c10::DeviceGuard> guard;
    if (current_device() != device_)
      guard.emplace(c10::Device(c10::DeviceType::PrivateUse1, device_));
    at::TensorBase fresh =
        strides.empty()
            ? at::detail::empty_generic(sizes, &caching_allocator(), kNeuronKeys,
                                        options.dtype().toScalarType(), options.memory_format_opt())
            : at::detail::empty_strided_generic(sizes, strides, &caching_allocator(), kNeuronKeys,
                                                options.dtype().toScalarType());
    op.tensor(c10::MaybeOwned<at::TensorBase>::owned(std::move(fresh)));
    op.current_dtype = op.target_dtype;
  }

 private:
  c10::DeviceIndex device_;
};

bool plain_floating(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1 &&
         at::isFloatingType(t.scalar_type()) && !t.is_neg();
}

// Whether a unary op's call can run here (see the file comment).
bool plain(const at::Tensor& self) {
  return plain_floating(self) && !async_candidate(self.nbytes());
}

// The same for a binary op; `in_place`: `self` is also the output, so `other` must broadcast
// to it without growing it.
bool plain(const at::Tensor& self, const at::Tensor& other, bool in_place) {
  if (!plain_floating(self) || !plain_floating(other)) return false;
  if (self.scalar_type() != other.scalar_type() || self.device() != other.device()) return false;
  if (in_place && !at::is_expandable_to(other.sizes(), self.sizes())) return false;
  return !async_candidate(self.nbytes() + other.nbytes());
}

// The counters of an op run here: its executed ops (torch.neuron's op statistics) and, in
// _C._native_kernel_runs() under "cpu_loop <op>", how many of its calls took this path.
struct LoopCounters {
  OpCounter& executed;
  std::atomic<uint64_t>& runs;
};

template <class Op>
LoopCounters& counters_of() {
  static LoopCounters counters{op_counter_named(TypedHostKernel<Op>::name()),
                               native_kernel_counter("cpu_loop " + TypedHostKernel<Op>::name())};
  return counters;
}

// Builds `iter` with `build` and runs `loop` on it as the op's kernel. The output stays in
// `iter`: an in-place caller returns its own reference to it, since copying a tensor that
// Python holds changes the Python object's count under the GIL.
template <class Build, class Loop>
void run_loop(LoopCounters& counters, const char* op, DeviceIterator& iter, Build build,
              Loop loop) {
  wait_for_device_work(counters.executed);
  build(iter);
  {
    const DeviceActivitySpan span(DeviceActivityKind::kKernel, op, iter.device());
    loop(iter);
  }
  counters.executed.executed.fetch_add(1, std::memory_order_relaxed);
  counters.runs.fetch_add(1, std::memory_order_relaxed);
}

// Which TensorIteratorBase::build_borrowing_* an op's CPU meta function calls. The float
// forms differ only for integer inputs, which never come here; they are kept for fidelity.
enum class Build { kBinaryOp, kBinaryFloatOp, kUnaryOp, kUnaryFloatOp };

void build(DeviceIterator& iter, Build kind, const at::Tensor& out, const at::Tensor& self,
           const at::Tensor& other) {
  switch (kind) {
    case Build::kBinaryOp:
      return iter.build_borrowing_binary_op(out, self, other);
    case Build::kBinaryFloatOp:
      return iter.build_borrowing_binary_float_op(out, self, other);
    case Build::kUnaryOp:
      return iter.build_borrowing_unary_op(out, self);
    case Build::kUnaryFloatOp:
      return iter.build_borrowing_unary_float_op(out, self);
  }
}

// A functional op over `self` (and `other`, for binary ops): a fresh output.
template <class Op, class Loop>
at::Tensor functional(Build kind, const at::Tensor& self, const at::Tensor& other, Loop loop) {
  const at::Tensor out;
  DeviceIterator iter(self.device().index());
  run_loop(
      counters_of<Op>(), Op::name, iter,
      [&](DeviceIterator& it) { build(it, kind, out, self, other); }, loop);
  return iter.output();
}

// An in-place binary op: `self` is the output.
template <class Op, class Loop>
at::Tensor& in_place(Build kind, at::Tensor& self, const at::Tensor& other, Loop loop) {
  DeviceIterator iter(self.device().index());
  run_loop(
      counters_of<Op>(), Op::name, iter,
      [&](DeviceIterator& it) { build(it, kind, self, self, other); }, loop);
  return self;
}

// Binary ops, as CPU eager runs them: add and sub check alpha (sub also rejects bool, which
// is not floating) and run add_stub with alpha or -alpha; mul runs mul_stub; div builds a
// binary float op and runs div_true_stub.

auto add_loop(const c10::Scalar& alpha) {
  return [alpha](DeviceIterator& iter) { at::native::add_stub(c10::DeviceType::CPU, iter, alpha); };
}
void mul_loop(DeviceIterator& iter) { at::native::mul_stub(c10::DeviceType::CPU, iter); }
void div_loop(DeviceIterator& iter) { at::native::div_true_stub(c10::DeviceType::CPU, iter); }

at::Tensor add(const at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha) {
  using Op = at::_ops::add_Tensor;
  if (!plain(self, other, false)) return TypedHostKernel<Op>::run(self, other, alpha);
  at::native::alpha_check(self.scalar_type(), alpha);
  return functional<Op>(Build::kBinaryOp, self, other, add_loop(alpha));
}

at::Tensor& add_(at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha) {
  using Op = at::_ops::add__Tensor;
  if (!plain(self, other, true)) return TypedHostKernel<Op>::run(self, other, alpha);
  at::native::alpha_check(self.scalar_type(), alpha);
  return in_place<Op>(Build::kBinaryOp, self, other, add_loop(alpha));
}

at::Tensor sub(const at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha) {
  using Op = at::_ops::sub_Tensor;
  if (!plain(self, other, false)) return TypedHostKernel<Op>::run(self, other, alpha);
  at::native::alpha_check(self.scalar_type(), alpha);
  return functional<Op>(Build::kBinaryOp, self, other, add_loop(-alpha));
}

at::Tensor& sub_(at::Tensor& self, const at::Tensor& other, const c10::Scalar& alpha) {
  using Op = at::_ops::sub__Tensor;
  if (!plain(self, other, true)) return TypedHostKernel<Op>::run(self, other, alpha);
  at::native::alpha_check(self.scalar_type(), alpha);
  return in_place<Op>(Build::kBinaryOp, self, other, add_loop(-alpha));
}

at::Tensor mul(const at::Tensor& self, const at::Tensor& other) {
  using Op = at::_ops::mul_Tensor;
  if (!plain(self, other, false)) return TypedHostKernel<Op>::run(self, other);
  return functional<Op>(Build::kBinaryOp, self, other, mul_loop);
}

at::Tensor& mul_(at::Tensor& self, const at::Tensor& other) {
  using Op = at::_ops::mul__Tensor;
  if (!plain(self, other, true)) return TypedHostKernel<Op>::run(self, other);
  return in_place<Op>(Build::kBinaryOp, self, other, mul_loop);
}

at::Tensor div(const at::Tensor& self, const at::Tensor& other) {
  using Op = at::_ops::div_Tensor;
  if (!plain(self, other, false)) return TypedHostKernel<Op>::run(self, other);
  return functional<Op>(Build::kBinaryFloatOp, self, other, div_loop);
}

at::Tensor& div_(at::Tensor& self, const at::Tensor& other) {
  using Op = at::_ops::div__Tensor;
  if (!plain(self, other, true)) return TypedHostKernel<Op>::run(self, other);
  return in_place<Op>(Build::kBinaryFloatOp, self, other, div_loop);
}

// Unary ops, as CPU eager runs them: neg builds a unary op, relu is clamp_min(self, 0) there
// (a unary op and clamp_min_scalar_stub), the rest build a unary float op; each runs its stub.

template <class Op, class Loop>
at::Tensor unary(Build kind, const at::Tensor& self, Loop loop) {
  if (!plain(self)) return TypedHostKernel<Op>::run(self);
  return functional<Op>(kind, self, at::Tensor(), loop);
}

template <class Op, class Stub>
at::Tensor unary_stub(Stub& stub, const at::Tensor& self, Build kind = Build::kUnaryFloatOp) {
  return unary<Op>(kind, self, [&stub](DeviceIterator& iter) { stub(c10::DeviceType::CPU, iter); });
}

at::Tensor neg(const at::Tensor& self) {
  return unary_stub<at::_ops::neg>(at::native::neg_stub, self, Build::kUnaryOp);
}
at::Tensor exp(const at::Tensor& self) {
  return unary_stub<at::_ops::exp>(at::native::exp_stub, self);
}
at::Tensor rsqrt(const at::Tensor& self) {
  return unary_stub<at::_ops::rsqrt>(at::native::rsqrt_stub, self);
}
at::Tensor sqrt(const at::Tensor& self) {
  return unary_stub<at::_ops::sqrt>(at::native::sqrt_stub, self);
}
at::Tensor tanh(const at::Tensor& self) {
  return unary_stub<at::_ops::tanh>(at::native::tanh_stub, self);
}
at::Tensor sigmoid(const at::Tensor& self) {
  return unary_stub<at::_ops::sigmoid>(at::native::sigmoid_stub, self);
}
at::Tensor relu(const at::Tensor& self) {
  return unary<at::_ops::relu>(Build::kUnaryOp, self, [](DeviceIterator& iter) {
    at::native::clamp_min_scalar_stub(c10::DeviceType::CPU, iter, c10::Scalar(0));
  });
}

// CPU eager's copy_impl copies a contiguous output from a transposed 2-D source of the same
// type and shape blockwise (copy_same_type_transpose_), not through the copy loop.
bool copies_as_transpose(const at::Tensor& self, const at::Tensor& src) {
  return self.is_contiguous() && src.numel() >= 60 * 60 && src.dim() == 2 && src.stride(0) == 1 &&
         src.stride(1) == src.size(0) && self.scalar_type() == src.scalar_type() &&
         self.sizes().equals(src.sizes());
}

}  // namespace

bool copy_within_device(at::Tensor& self, const at::Tensor& src) {
  if (!is_device_tensor(self) || !is_device_tensor(src) || self.device() != src.device()) {
    return false;
  }
  if (self.is_complex() || src.is_complex() || self.is_conj() || src.is_conj() || self.is_neg() ||
      src.is_neg() || src._is_zerotensor() || copies_as_transpose(self, src)) {
    return false;
  }
  if (self.is_alias_of(src) && self.storage_offset() == src.storage_offset() &&
      self.strides().equals(src.strides()) && self.sizes().equals(src.sizes()) &&
      self.scalar_type() == src.scalar_type()) {
    return true;  // the same elements: nothing to copy
  }
  at::TensorIterator iter = at::TensorIteratorConfig()
                                .add_output(self)
                                .add_const_input(src)
                                .resize_outputs(false)
                                .check_all_same_dtype(false)
                                .check_all_same_device(false)
                                .build();
  if (iter.numel() > 0) at::native::copy_stub(c10::DeviceType::CPU, iter, false);
  static std::atomic<uint64_t>& runs = native_kernel_counter("cpu_loop aten::copy_");
  runs.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void register_host_iterator_kernels(torch::Library& m) {
  m.impl("add.Tensor", TORCH_FN(add));
  m.impl("add_.Tensor", TORCH_FN(add_));
  m.impl("sub.Tensor", TORCH_FN(sub));
  m.impl("sub_.Tensor", TORCH_FN(sub_));
  m.impl("mul.Tensor", TORCH_FN(mul));
  m.impl("mul_.Tensor", TORCH_FN(mul_));
  m.impl("div.Tensor", TORCH_FN(div));
  m.impl("div_.Tensor", TORCH_FN(div_));
  m.impl("neg", TORCH_FN(neg));
  m.impl("exp", TORCH_FN(exp));
  m.impl("rsqrt", TORCH_FN(rsqrt));
  m.impl("sqrt", TORCH_FN(sqrt));
  m.impl("tanh", TORCH_FN(tanh));
  m.impl("sigmoid", TORCH_FN(sigmoid));
  m.impl("relu", TORCH_FN(relu));
}

}  // namespace torchneuron
