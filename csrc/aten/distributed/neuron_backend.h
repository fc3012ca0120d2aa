// The c10d backend "neuron" (registered by neuron_backend.cpp), declared once for the
// files that implement it: the collectives (collectives.cpp), point to point
// (point_to_point.cpp), the Gloo transport (gloo_transport.cpp), the reductions over the
// shared-memory group (reductions.cpp) and the argument checks (argument_checks.cpp).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/exception.h>

#include <chrono>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "shm_group.h"

namespace torchneuron {

class NeuronBackend final : public c10d::Backend {
 public:
  // `inner` (Gloo) carries point-to-point traffic, and every collective when `use_shm` is
  // false (ranks on several hosts, or TORCHNEURON_DIST_TRANSPORT=gloo). `remote_peers` names
  // the ranks on other hosts ("ranks 2, 3 on host b"; empty on one host) for Gloo's errors.
  NeuronBackend(const std::string& name, int rank, int size, std::chrono::milliseconds timeout,
                c10::intrusive_ptr<c10d::Backend> inner, bool use_shm, std::string remote_peers);

  const std::string getBackendName() const override { return "neuron"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  // Sequence numbers as Gloo keeps them: 0 when the group is made, one more per collective
  // (an operation made of others counts once). TORCH_DISTRIBUTED_DEBUG=DETAIL reads them.
  void setSequenceNumberForGroup() override { sequence_number_ = 0; }
  uint64_t getSequenceNumberForGroup() override { return sequence_number_; }

  // Point to point always goes through Gloo, over CPU views of the device memory, and
  // returns Gloo's own Work: the caller keeps the tensor alive until wait(), as on CUDA.
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;

 private:
  // ---- the Gloo transport (gloo_transport.cpp) ----
  // A CPU tensor over the same bytes, for Gloo (which refuses other devices). The view owns a
  // reference to the device storage: Gloo's Work keeps its tensors until the transfer is
  // done, and an isend's caller may drop its own reference at once (pipelining does), so
  // without it the caching allocator could hand the bytes to a new tensor mid-send.
  static at::Tensor host_view(const at::Tensor& t);
  void wait(const c10::intrusive_ptr<c10d::Work>& work);
  // Gloo has no PREMUL_SUM: the tensor is scaled here and summed there.
  c10d::ReduceOp gloo_op(at::Tensor& t, const c10d::ReduceOp& op);
  static c10d::ReduceOp::RedOpType to_c10d(nrt::dist::ReduceOp op);

  // Runs a shared-memory operation, its failures reported as DistBackendError.
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

  // ---- reductions over the shared-memory group (reductions.cpp) ----
  // SUM, PRODUCT, MIN, MAX directly; AVG as SUM then a division; PREMUL_SUM as a scaling
  // then SUM.
  nrt::dist::ReduceOp prepare(at::Tensor& t, const c10d::ReduceOp& op, const char* what);
  static nrt::dist::ShmGroup::Finish finish_of(const c10d::ReduceOp& op);
  void finish_average(at::Tensor& t, const c10d::ReduceOp& op);
  void check_average(const at::Tensor& t, const c10d::ReduceOp& op, const char* what);
  void reduce_in_place(at::Tensor& t, const c10d::ReduceOp& op, const char* what);
  void gather_into(at::Tensor& output, const at::Tensor& input, const char* what);
  void scatter_reduced(at::Tensor& output, const at::Tensor& input, const c10d::ReduceOp& op,
                       const char* what);

  // ---- argument checks (argument_checks.cpp) ----
  // Bytes per peer from split sizes along dim 0 (empty: equal splits).
  std::vector<size_t> split_bytes(const at::Tensor& t, const std::vector<int64_t>& splits,
                                  const char* what) const;
  static void check_pairs(const std::vector<at::Tensor>& outputs,
                          const std::vector<at::Tensor>& inputs, const char* what);

  // An operation's own timeout (dist.barrier(timeout=...), options passed to the group)
  // holds for the whole call, on either transport; unset means the group's. Restores the
  // outer value, since some operations are made of others. Every collective opens one, so
  // the outermost also counts the call's sequence number.
  class CallTimeout {
   public:
    CallTimeout(NeuronBackend& backend, std::chrono::milliseconds timeout)
        : backend_(backend), outer_(backend.call_timeout_) {
      if (backend_.call_depth_++ == 0) ++backend_.sequence_number_;
      if (timeout != c10d::kUnsetTimeout) backend_.apply_call_timeout(timeout);
    }
    CallTimeout(const CallTimeout&) = delete;
    CallTimeout& operator=(const CallTimeout&) = delete;
    ~CallTimeout() {
      backend_.apply_call_timeout(outer_);
      --backend_.call_depth_;
    }

   private:
    NeuronBackend& backend_;
    std::chrono::milliseconds outer_;
  };

  void apply_call_timeout(std::chrono::milliseconds timeout);

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
  uint64_t sequence_number_ = 0;
  int call_depth_ = 0;  // CallTimeouts open: operations made of others count once
};

}  // namespace torchneuron
