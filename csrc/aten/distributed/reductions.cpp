// The reductions of the c10d backend "neuron" over the shared-memory group: c10d's reduce
// ops mapped to the group's (AVG and PREMUL_SUM included), all_reduce, all_gather and
// reduce_scatter into tensors.
#include "distributed/argument_checks.h"
#include "distributed/neuron_backend.h"

namespace torchneuron {

using nrt::dist::ElementType;
using nrt::dist::ReduceOp;

// SUM, PRODUCT, MIN, MAX directly; AVG as SUM then a division; PREMUL_SUM as a scaling
// then SUM.
ReduceOp NeuronBackend::prepare(at::Tensor& t, const c10d::ReduceOp& op, const char* what) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::AVG:
      return ReduceOp::kSum;
    case c10d::ReduceOp::PRODUCT:
      return ReduceOp::kProduct;
    case c10d::ReduceOp::MIN:
      return ReduceOp::kMin;
    case c10d::ReduceOp::MAX:
      return ReduceOp::kMax;
    case c10d::ReduceOp::PREMUL_SUM: {
      auto* factor = dynamic_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
      TORCH_CHECK(factor != nullptr, "PREMUL_SUM without a factor");
      const double scale = factor->tensor_factor.defined() ? factor->tensor_factor.item<double>()
                                                           : factor->double_factor;
      t.mul_(scale);
      return ReduceOp::kSum;
    }
    default:
      C10_THROW_ERROR(DistBackendError,
                      std::string("neuron backend: ") + what +
                          " does not support this reduce op (BAND/BOR/BXOR); use SUM, AVG, "
                          "PRODUCT, MIN, MAX or PREMUL_SUM");
  }
}

nrt::dist::ShmGroup::Finish NeuronBackend::finish_of(const c10d::ReduceOp& op) {
  if (op.op_ == c10d::ReduceOp::AVG) return nrt::dist::ShmGroup::Finish::kAverage;
  if (op.op_ == c10d::ReduceOp::PREMUL_SUM) return nrt::dist::ShmGroup::Finish::kPremultiplied;
  return nrt::dist::ShmGroup::Finish::kNone;
}

void NeuronBackend::finish_average(at::Tensor& t, const c10d::ReduceOp& op) {
  if (op.op_ == c10d::ReduceOp::AVG) t.div_(size_);
}

void NeuronBackend::check_average(const at::Tensor& t, const c10d::ReduceOp& op, const char* what) {
  if (op.op_ == c10d::ReduceOp::AVG && !at::isFloatingType(t.scalar_type())) {
    C10_THROW_ERROR(DistBackendError, std::string("neuron backend: ") + what +
                                          " with AVG needs a floating-point tensor, got " +
                                          c10::toString(t.scalar_type()));
  }
}

void NeuronBackend::reduce_in_place(at::Tensor& t, const c10d::ReduceOp& op, const char* what) {
  check_average(t, op, what);
  const ElementType type = element_type(t);
  void* data = host_bytes(t, what);
  const ReduceOp reduce = prepare(t, op, what);
  run(what, [&] { group_->all_reduce(data, t.numel(), type, reduce, finish_of(op)); });
  finish_average(t, op);
}

void NeuronBackend::gather_into(at::Tensor& output, const at::Tensor& input, const char* what) {
  if (output.numel() != input.numel() * size_ || output.scalar_type() != input.scalar_type()) {
    C10_THROW_ERROR(DistBackendError, std::string("neuron backend: ") + what +
                                          ": the output must hold world size x input "
                                          "elements of the input's dtype");
  }
  const void* in = host_bytes(input, what);
  void* out = host_bytes(output, what);
  if (!group_) {
    at::Tensor host_out = host_view(output);
    at::Tensor host_in = host_view(input);
    wait(inner_->_allgather_base(host_out, host_in, timed<c10d::AllgatherOptions>()));
    return;
  }
  run(what,
      [&] { group_->all_gather(in, out, input.nbytes(), c10::toString(input.scalar_type())); });
}

void NeuronBackend::scatter_reduced(at::Tensor& output, const at::Tensor& input,
                                    const c10d::ReduceOp& op, const char* what) {
  if (input.numel() != output.numel() * size_ || output.scalar_type() != input.scalar_type()) {
    C10_THROW_ERROR(DistBackendError, std::string("neuron backend: ") + what +
                                          ": the input must hold world size x output "
                                          "elements of the output's dtype");
  }
  check_average(output, op, what);
  at::Tensor source = input;
  if (op.op_ == c10d::ReduceOp::PREMUL_SUM) source = input.clone();  // inputs stay intact
  const ReduceOp reduce = prepare(source, op, what);
  const ElementType type = element_type(output);
  const void* in = host_bytes(source, what);
  void* out = host_bytes(output, what);
  if (!group_) {
    at::Tensor host_out = host_view(output);
    at::Tensor host_in = host_view(source);
    auto o = timed<c10d::ReduceScatterOptions>();
    o.reduceOp = c10d::ReduceOp(to_c10d(reduce));
    wait(inner_->_reduce_scatter_base(host_out, host_in, o));
  } else {
    run(what,
        [&] { group_->reduce_scatter(in, out, output.numel(), type, reduce, finish_of(op)); });
  }
  finish_average(output, op);
}

}  // namespace torchneuron
