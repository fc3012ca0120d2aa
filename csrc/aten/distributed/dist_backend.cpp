#include "distributed/dist_backend.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <pybind11/chrono.h>
#include <torch/csrc/distributed/c10d/exception.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <numeric>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "launch/async_launch.h"
#include "shm_group.h"

namespace py = pybind11;

namespace torchneuron {
namespace {

using nrt::dist::ElementType;
using nrt::dist::ReduceOp;

ElementType element_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return ElementType::kFloat32;
    case at::kDouble:
      return ElementType::kFloat64;
    case at::kBFloat16:
      return ElementType::kBFloat16;
    case at::kHalf:
      return ElementType::kFloat16;
    case at::kChar:
      return ElementType::kInt8;
    case at::kByte:
      return ElementType::kUInt8;
    case at::kInt:
      return ElementType::kInt32;
    case at::kLong:
      return ElementType::kInt64;
    case at::kBool:
      return ElementType::kBool;
    default:
      C10_THROW_ERROR(DistBackendError, std::string("neuron backend: dtype ") +
                                            c10::toString(t.scalar_type()) +
                                            " is not supported by its collectives");
  }
}

// The tensor's bytes, read and written in place: device memory is host-addressable.
void* host_bytes(const at::Tensor& t, const char* what) {
  if (!t.is_contiguous()) {
    C10_THROW_ERROR(DistBackendError, std::string("neuron backend: ") + what +
                                          " needs contiguous tensors; call .contiguous()");
  }
  if (!t.is_cpu() && t.device().type() != c10::DeviceType::PrivateUse1) {
    C10_THROW_ERROR(DistBackendError, std::string("neuron backend: ") + what + " got a tensor on " +
                                          t.device().str() + "; it takes neuron or CPU tensors");
  }
  wait_for_device_work();  // launched work that writes the tensor completes first
  return t.data_ptr();
}

at::Tensor& single(std::vector<at::Tensor>& tensors, const char* what) {
  if (tensors.size() != 1) {
    C10_THROW_ERROR(DistBackendError, std::string("neuron backend: ") + what +
                                          " takes one tensor per rank (one device per "
                                          "process), got " +
                                          std::to_string(tensors.size()));
  }
  return tensors[0];
}

c10::intrusive_ptr<c10d::Work> completed(std::vector<at::Tensor> outputs) {
  auto future =
      c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  future->markCompleted(c10::IValue(std::move(outputs)));
  return c10d::Work::create_from_future(future);
}

class NeuronBackend final : public c10d::Backend {
 public:
  // `inner` (Gloo) carries point-to-point traffic, and every collective when `use_shm` is
  // false (ranks on several hosts, or TORCHNEURON_DIST_TRANSPORT=gloo). `remote_peers` names
  // the ranks on other hosts ("ranks 2, 3 on host b"; empty on one host) for Gloo's errors.
  NeuronBackend(const std::string& name, int rank, int size, std::chrono::milliseconds timeout,
                c10::intrusive_ptr<c10d::Backend> inner, bool use_shm, std::string remote_peers)
      : c10d::Backend(rank, size),
        timeout_(timeout),
        inner_(std::move(inner)),
        remote_peers_(std::move(remote_peers)) {
    if (use_shm) {
      nrt::dist::GroupOptions options;
      options.name = name;
      options.rank = rank;
      options.size = size;
      options.timeout = timeout;
      try {
        group_ = std::make_unique<nrt::dist::ShmGroup>(options);
      } catch (const std::exception& e) {
        C10_THROW_ERROR(DistBackendError, std::string("neuron backend: ") + e.what());
      }
    }
    init();
  }

  const std::string getBackendName() const override { return "neuron"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
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

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    for (at::Tensor& t : tensors) {
      std::vector<at::Tensor> one{t};
      allreduce(one, opts);
    }
    return completed(tensors);
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
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

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
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

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    const CallTimeout call_timeout(*this, opts.timeout);
    gather_into(output, input, "all_gather_into_tensor");
    return completed({output});
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    const CallTimeout call_timeout(*this, opts.timeout);
    check_pairs(outputs, inputs, "all_gather_into_tensor_coalesced");
    for (size_t i = 0; i < inputs.size(); ++i) {
      gather_into(outputs[i], inputs[i], "all_gather_into_tensor_coalesced");
    }
    return completed(outputs);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
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

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override {
    const CallTimeout call_timeout(*this, opts.timeout);
    scatter_reduced(output, input, opts.reduceOp, "reduce_scatter_tensor");
    return completed({output});
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    const CallTimeout call_timeout(*this, opts.timeout);
    check_pairs(outputs, inputs, "reduce_scatter_tensor_coalesced");
    for (size_t i = 0; i < inputs.size(); ++i) {
      scatter_reduced(outputs[i], inputs[i], opts.reduceOp, "reduce_scatter_tensor_coalesced");
    }
    return completed(outputs);
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
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

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
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

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override {
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

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
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

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    const CallTimeout call_timeout(*this, opts.timeout);
    if (!group_) {
      wait(inner_->barrier(timed(opts)));
      return completed({});
    }
    run("barrier", [&] { group_->barrier(); });
    return completed({});
  }

  // Point to point always goes through Gloo, over CPU views of the device memory, and
  // returns Gloo's own Work: the caller keeps the tensor alive until wait(), as on CUDA.
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    std::vector<at::Tensor> host{host_view(single(tensors, "send"))};
    return inner_->send(host, dst, tag);  // not waited here: isend; irecv must not deadlock
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    std::vector<at::Tensor> host{host_view(single(tensors, "recv"))};
    return inner_->recv(host, src, tag);
  }

 private:
  // A CPU tensor over the same bytes, for Gloo (which refuses other devices). The view owns a
  // reference to the device storage: Gloo's Work keeps its tensors until the transfer is
  // done, and an isend's caller may drop its own reference at once (pipelining does), so
  // without it the caching allocator could hand the bytes to a new tensor mid-send.
  static at::Tensor host_view(const at::Tensor& t) {
    host_bytes(t, "a Gloo collective");
    if (t.is_cpu()) return t;
    c10::Storage keep_alive = t.storage();
    return at::from_blob(
        t.data_ptr(), t.sizes(), t.strides(), [keep_alive](void*) mutable { keep_alive = {}; },
        t.options().device(at::kCPU));
  }

  void wait(const c10::intrusive_ptr<c10d::Work>& work) {
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
  c10d::ReduceOp gloo_op(at::Tensor& t, const c10d::ReduceOp& op) {
    if (op.op_ != c10d::ReduceOp::PREMUL_SUM) return op;
    prepare(t, op, "all_reduce");
    return c10d::ReduceOp(c10d::ReduceOp::SUM);
  }

  static c10d::ReduceOp::RedOpType to_c10d(ReduceOp op) {
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

  template <class Fn>
  void run(const char* what, Fn&& fn) {
    try {
      fn();
    } catch (const c10::Error&) {
      throw;
    } catch (const std::exception& e) {
      C10_THROW_ERROR(DistBackendError,
                      std::string("neuron backend: ") + what + " failed: " + e.what());
    }
  }

  // SUM, PRODUCT, MIN, MAX directly; AVG as SUM then a division; PREMUL_SUM as a scaling
  // then SUM.
  ReduceOp prepare(at::Tensor& t, const c10d::ReduceOp& op, const char* what) {
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

  static nrt::dist::ShmGroup::Finish finish_of(const c10d::ReduceOp& op) {
    if (op.op_ == c10d::ReduceOp::AVG) return nrt::dist::ShmGroup::Finish::kAverage;
    if (op.op_ == c10d::ReduceOp::PREMUL_SUM) return nrt::dist::ShmGroup::Finish::kPremultiplied;
    return nrt::dist::ShmGroup::Finish::kNone;
  }

  void finish_average(at::Tensor& t, const c10d::ReduceOp& op) {
    if (op.op_ == c10d::ReduceOp::AVG) t.div_(size_);
  }

  void check_average(const at::Tensor& t, const c10d::ReduceOp& op, const char* what) {
    if (op.op_ == c10d::ReduceOp::AVG && !at::isFloatingType(t.scalar_type())) {
      C10_THROW_ERROR(DistBackendError, std::string("neuron backend: ") + what +
                                            " with AVG needs a floating-point tensor, got " +
                                            c10::toString(t.scalar_type()));
    }
  }

  void reduce_in_place(at::Tensor& t, const c10d::ReduceOp& op, const char* what) {
    check_average(t, op, what);
    const ElementType type = element_type(t);
    void* data = host_bytes(t, what);
    const ReduceOp reduce = prepare(t, op, what);
    run(what, [&] { group_->all_reduce(data, t.numel(), type, reduce, finish_of(op)); });
    finish_average(t, op);
  }

  void gather_into(at::Tensor& output, const at::Tensor& input, const char* what) {
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

  void scatter_reduced(at::Tensor& output, const at::Tensor& input, const c10d::ReduceOp& op,
                       const char* what) {
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

  // Bytes per peer from split sizes along dim 0 (empty: equal splits).
  std::vector<size_t> split_bytes(const at::Tensor& t, const std::vector<int64_t>& splits,
                                  const char* what) const {
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    const size_t row_bytes = rows == 0 ? 0 : t.nbytes() / static_cast<size_t>(rows);
    std::vector<size_t> bytes(size_);
    if (splits.empty()) {
      if (rows % size_ != 0) {
        C10_THROW_ERROR(DistBackendError, std::string("neuron backend: all_to_all_single: ") +
                                              std::to_string(rows) +
                                              " rows do not split evenly over " +
                                              std::to_string(size_) + " ranks; pass " + what);
      }
      std::fill(bytes.begin(), bytes.end(), row_bytes * static_cast<size_t>(rows / size_));
      return bytes;
    }
    int64_t total = 0;
    for (int r = 0; r < size_ && r < static_cast<int>(splits.size()); ++r) total += splits[r];
    if (splits.size() != static_cast<size_t>(size_) || total != rows) {
      C10_THROW_ERROR(DistBackendError, std::string("neuron backend: all_to_all_single: ") + what +
                                            " must have world size entries summing to " +
                                            std::to_string(rows));
    }
    for (int r = 0; r < size_; ++r) bytes[r] = row_bytes * static_cast<size_t>(splits[r]);
    return bytes;
  }

  static void check_pairs(const std::vector<at::Tensor>& outputs,
                          const std::vector<at::Tensor>& inputs, const char* what) {
    if (outputs.size() != inputs.size()) {
      C10_THROW_ERROR(DistBackendError,
                      std::string("neuron backend: ") + what + " needs as many outputs as inputs");
    }
  }

  // An operation's own timeout (dist.barrier(timeout=...), options passed to the group)
  // holds for the whole call, on either transport; unset means the group's. Restores the
  // outer value, since some operations are made of others.
  class CallTimeout {
   public:
    CallTimeout(NeuronBackend& backend, std::chrono::milliseconds timeout)
        : backend_(backend), outer_(backend.call_timeout_) {
      if (timeout != c10d::kUnsetTimeout) backend_.apply_call_timeout(timeout);
    }
    CallTimeout(const CallTimeout&) = delete;
    CallTimeout& operator=(const CallTimeout&) = delete;
    ~CallTimeout() { backend_.apply_call_timeout(outer_); }

   private:
    NeuronBackend& backend_;
    std::chrono::milliseconds outer_;
  };

  void apply_call_timeout(std::chrono::milliseconds timeout) {
    call_timeout_ = timeout;
    if (group_) group_->set_call_timeout(timeout);
  }

  // Options made here carry the call's or the group's timeout: Gloo does not resolve
  // "unset" itself.
  template <class Options>
  Options timed(Options options = Options()) const {
    if (options.timeout == c10d::kUnsetTimeout) {
      options.timeout = call_timeout_ != c10d::kUnsetTimeout ? call_timeout_ : timeout_;
    }
    return options;
  }

  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds call_timeout_ = c10d::kUnsetTimeout;
  c10::intrusive_ptr<c10d::Backend> inner_;
  std::string remote_peers_;
  std::unique_ptr<nrt::dist::ShmGroup> group_;  // null: every collective goes through inner_
};

}  // namespace

void register_dist_backend(py::module_& m) {
  m.def(
      "_dist_create_backend",
      [](const std::string& name, int rank, int size, std::chrono::milliseconds timeout,
         c10::intrusive_ptr<c10d::Backend> inner, bool use_shm,
         std::string remote_peers) -> c10::intrusive_ptr<c10d::Backend> {
        return c10::make_intrusive<NeuronBackend>(name, rank, size, timeout, std::move(inner),
                                                  use_shm, std::move(remote_peers));
      },
      py::arg("name"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("inner"),
      py::arg("use_shm"), py::arg("remote_peers") = std::string(),
      py::call_guard<py::gil_scoped_release>());
}

}  // namespace torchneuron
