// The collectives of the c10d backend "neuron": each over the shared-memory group, or over
// Gloo when the group spans hosts (or TORCHNEURON_DIST_TRANSPORT=gloo).
#include <numeric>

#include "distributed/argument_checks.h"
#include "distributed/neuron_backend.h"

namespace torchneuron {

c10::intrusive_ptr<c10d::Work> NeuronBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::AllreduceOptions& opts) {
  const CallTimeout call_timeout(*this, opts.timeout);
  at::Tensor& t = single(tensors, "all_reduce");
  if (!group_) {
    std::vector<at::Tensor> host{host_view(t)};
    c10d::AllreduceOptions o = timed(opts);
    o.reduceOp = gloo_op(t, opts.reduceOp);
    wait(inner_->allreduce(host, o));
    return completed(tensors);
  }
  reduce_in_place(t, opts.reduceOp, "all_reduce");
  return completed(tensors);
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  for (at::Tensor& t : tensors) {
    std::vector<at::Tensor> one{t};
    allreduce(one, opts);
  }
  return completed(tensors);
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                        const c10d::BroadcastOptions& opts) {
  const CallTimeout call_timeout(*this, opts.timeout);
  at::Tensor& t = single(tensors, "broadcast");
  if (!group_) {
    std::vector<at::Tensor> host{host_view(t)};
    wait(inner_->broadcast(host, timed(opts)));
    return completed(tensors);
  }
  run("broadcast", [&] {
    group_->broadcast(host_bytes(t, "broadcast"), t.nbytes(), static_cast<int>(opts.rootRank),
                      c10::toString(t.scalar_type()));
  });
  return completed(tensors);
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::reduce(std::vector<at::Tensor>& tensors,
                                                     const c10d::ReduceOptions& opts) {
  const CallTimeout call_timeout(*this, opts.timeout);
  at::Tensor& t = single(tensors, "reduce");
  if (!group_) {
    std::vector<at::Tensor> host{host_view(t)};
    c10d::ReduceOptions o = timed(opts);
    o.reduceOp = gloo_op(t, opts.reduceOp);
    wait(inner_->reduce(host, o));
    return completed(tensors);
  }
  at::Tensor work = rank_ == opts.rootRank ? t : t.clone();
  reduce_in_place(work, opts.reduceOp, "reduce");
  return completed(tensors);
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                              const c10d::AllgatherOptions& opts) {
  const CallTimeout call_timeout(*this, opts.timeout);
  gather_into(output, input, "all_gather_into_tensor");
  return completed({output});
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const CallTimeout call_timeout(*this, opts.timeout);
  check_pairs(outputs, inputs, "all_gather_into_tensor_coalesced");
  for (size_t i = 0; i < inputs.size(); ++i) {
    gather_into(outputs[i], inputs[i], "all_gather_into_tensor_coalesced");
  }
  return completed(outputs);
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const CallTimeout call_timeout(*this, opts.timeout);
  at::Tensor& input = single(inputs, "all_gather");
  if (outputs.size() != 1 || outputs[0].size() != static_cast<size_t>(size_)) {
    C10_THROW_ERROR(DistBackendError,
                    "neuron backend: all_gather needs one output list of world size");
  }
  at::Tensor flat = at::empty({size_ * input.numel()}, input.options());
  at::Tensor contiguous = input.contiguous();
  gather_into(flat, contiguous, "all_gather");
  for (int r = 0; r < size_; ++r) {
    outputs[0][r].copy_(flat.narrow(0, r * input.numel(), input.numel()).view_as(input));
  }
  return completed(outputs[0]);
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  const CallTimeout call_timeout(*this, opts.timeout);
  scatter_reduced(output, input, opts.reduceOp, "reduce_scatter_tensor");
  return completed({output});
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const CallTimeout call_timeout(*this, opts.timeout);
  check_pairs(outputs, inputs, "reduce_scatter_tensor_coalesced");
  for (size_t i = 0; i < inputs.size(); ++i) {
    scatter_reduced(outputs[i], inputs[i], opts.reduceOp, "reduce_scatter_tensor_coalesced");
  }
  return completed(outputs);
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::scatter(std::vector<at::Tensor>& outputs,
                                                      std::vector<std::vector<at::Tensor>>& inputs,
                                                      const c10d::ScatterOptions& opts) {
  const CallTimeout call_timeout(*this, opts.timeout);
  at::Tensor& output = single(outputs, "scatter");
  const int root = static_cast<int>(opts.rootRank);
  if (rank_ == root && (inputs.size() != 1 || inputs[0].size() != static_cast<size_t>(size_))) {
    C10_THROW_ERROR(DistBackendError,
                    "neuron backend: scatter needs one input list of world size on the root");
  }
  // One broadcast per destination: simple and correct; a direct path is future work.
  at::Tensor staging = at::empty_like(output, at::MemoryFormat::Contiguous);
  for (int r = 0; r < size_; ++r) {
    if (rank_ == root) staging.copy_(inputs[0][r]);
    std::vector<at::Tensor> one{staging};
    auto options = timed<c10d::BroadcastOptions>();
    options.rootRank = root;
    broadcast(one, options);
    if (rank_ == r) output.copy_(staging);
  }
  return completed(outputs);
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::GatherOptions& opts) {
  const CallTimeout call_timeout(*this, opts.timeout);
  at::Tensor input = single(inputs, "gather").contiguous();
  at::Tensor flat = at::empty({size_ * input.numel()}, input.options());
  gather_into(flat, input, "gather");
  if (rank_ == opts.rootRank) {
    if (outputs.size() != 1 || outputs[0].size() != static_cast<size_t>(size_)) {
      C10_THROW_ERROR(DistBackendError,
                      "neuron backend: gather needs one output list of world size on the root");
    }
    for (int r = 0; r < size_; ++r) {
      outputs[0][r].copy_(flat.narrow(0, r * input.numel(), input.numel()).view_as(input));
    }
    return completed(outputs[0]);
  }
  return completed({});
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                            std::vector<int64_t>& output_splits,
                                                            std::vector<int64_t>& input_splits,
                                                            const c10d::AllToAllOptions& opts) {
  const CallTimeout call_timeout(*this, opts.timeout);
  if (input.scalar_type() != output.scalar_type()) {
    C10_THROW_ERROR(DistBackendError,
                    "neuron backend: all_to_all_single needs input and output of one dtype");
  }
  const std::vector<size_t> send = split_bytes(input, input_splits, "input_split_sizes");
  const std::vector<size_t> recv = split_bytes(output, output_splits, "output_split_sizes");
  const void* in = host_bytes(input, "all_to_all_single");
  void* out = host_bytes(output, "all_to_all_single");
  if (!group_) {
    at::Tensor host_out = host_view(output);
    at::Tensor host_in = host_view(input);
    wait(inner_->alltoall_base(host_out, host_in, output_splits, input_splits, timed(opts)));
    return completed({output});
  }
  run("all_to_all_single", [&] { group_->all_to_all(in, send.data(), out, recv.data()); });
  return completed({output});
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::alltoall(std::vector<at::Tensor>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::AllToAllOptions& opts) {
  const CallTimeout call_timeout(*this, opts.timeout);
  if (inputs.size() != static_cast<size_t>(size_) || outputs.size() != inputs.size()) {
    C10_THROW_ERROR(DistBackendError,
                    "neuron backend: all_to_all needs world-size lists of inputs and outputs");
  }
  std::vector<at::Tensor> flat_in;
  std::vector<size_t> send, recv;
  for (int r = 0; r < size_; ++r) {
    flat_in.push_back(inputs[r].contiguous().view(-1));
    send.push_back(inputs[r].nbytes());
    recv.push_back(outputs[r].nbytes());
  }
  at::Tensor packed_in = at::cat(flat_in);
  at::Tensor packed_out =
      at::empty({static_cast<int64_t>(std::accumulate(recv.begin(), recv.end(), size_t{0}) /
                                      outputs[0].element_size())},
                outputs[0].options());
  const void* in = host_bytes(packed_in, "all_to_all");
  void* out = host_bytes(packed_out, "all_to_all");
  if (!group_) {
    std::vector<int64_t> out_splits, in_splits;
    for (int r = 0; r < size_; ++r) {
      in_splits.push_back(static_cast<int64_t>(send[r] / outputs[0].element_size()));
      out_splits.push_back(static_cast<int64_t>(recv[r] / outputs[0].element_size()));
    }
    at::Tensor host_out = host_view(packed_out);
    at::Tensor host_in = host_view(packed_in);
    wait(inner_->alltoall_base(host_out, host_in, out_splits, in_splits, timed(opts)));
  } else {
    run("all_to_all", [&] { group_->all_to_all(in, send.data(), out, recv.data()); });
  }
  int64_t at = 0;
  for (int r = 0; r < size_; ++r) {
    const int64_t n = outputs[r].numel();
    outputs[r].copy_(packed_out.narrow(0, at, n).view_as(outputs[r]));
    at += n;
  }
  return completed(outputs);
}

c10::intrusive_ptr<c10d::Work> NeuronBackend::barrier(const c10d::BarrierOptions& opts) {
  const CallTimeout call_timeout(*this, opts.timeout);
  if (!group_) {
    wait(inner_->barrier(timed(opts)));
    return completed({});
  }
  run("barrier", [&] { group_->barrier(); });
  return completed({});
}

}  // namespace torchneuron
