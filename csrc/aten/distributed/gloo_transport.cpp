// The Gloo side of the c10d backend "neuron": CPU views of device memory for Gloo, its
// errors with the peers named, and the reduce ops Gloo lacks.
#include "distributed/argument_checks.h"
#include "distributed/neuron_backend.h"

namespace torchneuron {

using nrt::dist::ElementType;
using nrt::dist::ReduceOp;

// A CPU tensor over the same bytes, for Gloo (which refuses other devices). The view owns a
// reference to the device storage: Gloo's Work keeps its tensors until the transfer is
// done, and an isend's caller may drop its own reference at once (pipelining does), so
// without it the caching allocator could hand the bytes to a new tensor mid-send.
at::Tensor NeuronBackend::host_view(const at::Tensor& t) {
  host_bytes(t, "a Gloo collective");
  if (t.is_cpu()) return t;
  c10::Storage keep_alive = t.storage();
  return at::from_blob(
      t.data_ptr(), t.sizes(), t.strides(), [keep_alive](void*) mutable { keep_alive = {}; },
      t.options().device(at::kCPU));
}

void NeuronBackend::wait(const c10::intrusive_ptr<c10d::Work>& work) {
  try {
    work->wait();
  } catch (const c10::Error&) {
    throw;
  } catch (const std::exception& e) {
    // Gloo's timeout does not say whom it waited for: name the peers across the network.
    std::string peers;
    if (!remote_peers_.empty()) {
      peers = " (peers on other hosts, reached over the network: " + remote_peers_ + ")";
    }
    C10_THROW_ERROR(DistBackendError,
                    std::string("neuron backend (Gloo transport): ") + e.what() + peers);
  }
}

// Gloo has no PREMUL_SUM: the tensor is scaled here and summed there.
c10d::ReduceOp NeuronBackend::gloo_op(at::Tensor& t, const c10d::ReduceOp& op) {
  if (op.op_ != c10d::ReduceOp::PREMUL_SUM) return op;
  prepare(t, op, "all_reduce");
  return c10d::ReduceOp(c10d::ReduceOp::SUM);
}

c10d::ReduceOp::RedOpType NeuronBackend::to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return c10d::ReduceOp::SUM;
    case ReduceOp::kProduct:
      return c10d::ReduceOp::PRODUCT;
    case ReduceOp::kMax:
      return c10d::ReduceOp::MAX;
    case ReduceOp::kMin:
      return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

}  // namespace torchneuron
