// Point to point of the c10d backend "neuron" (send, recv): always through Gloo, over CPU
// views of the device memory, returning Gloo's own Work: the caller keeps the tensor alive
// until wait(), as on CUDA.
#include "distributed/argument_checks.h"
#include "distributed/neuron_backend.h"

namespace torchneuron {

c10::intrusive_ptr<c10d::Work> NeuronBackend::send(std::vector<at::Tensor>& tensors, int dst,
                                                   int tag) {
  std::vector<at::Tensor> host{host_view(single(tensors, "send"))};
  return inner_->send(host, dst, tag);  // not waited here: isend; irecv must not deadlock
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::recv(std::vector<at::Tensor>& tensors, int src,
                                                   int tag) {
  std::vector<at::Tensor> host{host_view(single(tensors, "recv"))};
  return inner_->recv(host, src, tag);
}

}  // namespace torchneuron
