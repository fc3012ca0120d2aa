// Asynchronous launches (async_launch.h): results allocated up front from the meta kernel's
// shapes, the op queued on its stream's worker, and the waits before the host reads memory.
#include "launch/async_launch.h"

#include <ATen/Parallel.h>
#include <Python.h>
#include <c10/core/Allocator.h>
#include <c10/core/GradMode.h>
#include <c10/core/InferenceMode.h>
#include <c10/core/StorageImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/SmallVector.h>

#include <atomic>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "device/device_state.h"
#include "device/runtime_status.h"
#include "device/stream_state.h"
#include "launch/launch_plan.h"
#include "launch/launch_spec.h"
#include "memory/caching_allocator.h"
#include "memory/host_alias.h"
#include "native/aten_parallel.h"
#include "profiler/device_activity.h"

// MKL's per-thread setting (the C entry point; mkl_set_num_threads_local is its Fortran one,
// taking a pointer), exported by libtorch_cpu where PyTorch is built with MKL; weak,
// so builds without MKL load (the pointer is null there).
extern "C" int MKL_Set_Num_Threads_Local(int threads) __attribute__((weak));

namespace torchneuron {
namespace {

thread_local bool tls_on_worker = false;
std::atomic<int64_t> g_pending{0};  // launched ops not yet finished (and freed)
std::atomic<bool> g_has_error{false};
std::mutex g_error_mutex;
std::exception_ptr g_error;  // the first error since the last raise; guarded by g_error_mutex

size_t min_async_bytes() {
  static const size_t value = [] {
    const char* text = std::getenv("TORCHNEURON_ASYNC_MIN_BYTES");
    if (text == nullptr || *text == '\0') return size_t{256} * 1024;
    char* end = nullptr;
    const unsigned long long parsed = std::strtoull(text, &end, 10);
    TORCH_CHECK(*text != '-' && end != text && *end == '\0',
                "TORCHNEURON_ASYNC_MIN_BYTES must be a number of bytes (e.g. 262144; 0 launches "
                "every eligible op asynchronously), got '",
                text, "'");
    return static_cast<size_t>(parsed);
  }();
  return value;
}

// The worker's copies of one launch's arguments and results. A neuron tensor becomes a new
// tensor object (the caller may change the original's geometry meanwhile, e.g. t_()) over a
// storage that does not own the memory when the caching allocator does: a free by the
// caller returns the block to its stream's pool at once, as on a device with stream-ordered
// allocation, and only work queued after this launch on that stream can get it again (the
// worker allocates from a pool of its own). Other memory (shared segments) is held until the
// work completes. Tensors sharing a storage get snapshots sharing one, so overlap checks on
// the worker see what the caller's tensors would. A host tensor becomes a copy of its
// values as they are now.
class Snapshots {
 public:
  at::Tensor operator()(const at::Tensor& t) {
    if (!t.defined()) return t;
    if (t.device().is_cpu()) return host_copy(t);
    return device_tensor_on(storage_for(t.storage()), t);
  }

  c10::IValue operator()(const c10::IValue& value) {
    if (value.isTensor()) return (*this)(value.toTensor());
    if (value.isTensorList()) {
      c10::List<at::Tensor> list;
      list.reserve(value.toTensorList().size());
      for (const at::Tensor& t : value.toTensorList()) list.push_back((*this)(t));
      return list;
    }
    if (value.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> list;
      for (const std::optional<at::Tensor> t : value.toOptionalTensorList()) {
        list.push_back(t.has_value() ? std::optional<at::Tensor>((*this)(*t)) : std::nullopt);
      }
      return list;
    }
    return value;
  }

 private:
  c10::Storage storage_for(const c10::Storage& storage) {
    const c10::StorageImpl* key = storage.unsafeGetStorageImpl();
    for (const auto& [device, copy] : storages_) {
      if (device == key) return copy;
    }
    c10::Storage copy = storage;  // held: memory the caching allocator does not own
    if (CachingAllocator::owns(storage.data_ptr())) {
      copy = c10::Storage(c10::Storage::use_byte_size_t(), storage.nbytes(),
                          c10::DataPtr(storage.mutable_data(), storage.device()),
                          &caching_allocator(), /*resizable=*/false);
    }
    storages_.emplace_back(key, copy);
    return copy;
  }

  static at::Tensor host_copy(const at::Tensor& t) {
    at::Tensor copy = t.clone();
    // A Python number wrapped as a tensor promotes types as a number, not as a tensor.
    if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
      copy.unsafeGetTensorImpl()->set_wrapped_number(true);
    }
    return copy;
  }

  c10::SmallVector<std::pair<const c10::StorageImpl*, c10::Storage>, 4> storages_;
};

// This (worker) thread's intra-op threads for OpenMP and MKL. Not at::set_num_threads: it
// also sets the default of threads started later, resizes XNNPACK's pool and empties
// oneDNN's cache, all process-wide settings that are the caller's.
void set_worker_intra_op_threads(int threads) {
#ifdef _OPENMP
  omp_set_num_threads(threads);
#endif
  if (MKL_Set_Num_Threads_Local != nullptr) MKL_Set_Num_Threads_Local(threads);
}

// One launched op, owned by its task.
struct LaunchedOp {
  c10::OperatorHandle op;
  AsyncPlan* plan;
  torch::jit::Stack stack;  // snapshots of the arguments
  // Per return: the caller's fresh results as objects of the task's own, over the same
  // storages, or None. The caller's tensor objects may be Python objects, and releasing
  // one's last reference here would take the GIL.
  std::vector<c10::IValue> results;
  std::vector<ReservedAllocations::Block> reserved;
  c10::DeviceIndex device;
  c10::Stream stream;
  int threads;
  uint64_t correlation;  // the profiled op that launched it (device_activity.h), or 0
  bool grad_enabled;     // the caller's grad mode (kernels may choose by it)
  // The caller's inference mode: the results it holds are inference tensors then, and
  // writing them (settle) or creating tensors outside the mode would be refused.
  bool inference_mode;

  void run() {
    tls_on_worker = true;
    if (current_device() != device) set_device(device);
    if (current_stream(device) != stream) exchange_stream(stream);
    if (at::get_num_threads() != threads) set_worker_intra_op_threads(threads);
    std::optional<c10::InferenceMode> inference;
    if (inference_mode) inference.emplace();
    const c10::AutoGradMode grad_mode(grad_enabled);
    if (correlation != 0) push_launch_correlation(correlation);
    try {
      {
        const ReservedAllocations scope(&reserved, stream.id());
        op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), &stack);
      }
      const ReservedAllocations pool_only(nullptr, stream.id());
      settle();
    } catch (c10::Error& error) {
      error.add_context("neuron: raised by " + plan->name +
                        ", which ran asynchronously; set NEURON_LAUNCH_BLOCKING=1 to raise "
                        "errors where the op is called");
      record(std::current_exception());
    } catch (const std::exception& error) {
      record(std::make_exception_ptr(c10::Error(
          {__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
          "neuron: " + plan->name + " failed while running asynchronously: " + error.what())));
    }
    if (correlation != 0) pop_launch_correlation();
  }

  // Puts each result the kernel computed into the memory the caller already holds, unless
  // it is there already (it was allocated from the reservation).
  void settle() const {
    const size_t first = stack.size() - results.size();
    for (size_t j = 0; j < results.size(); ++j) {
      const c10::IValue& computed = stack[first + j];
      if (results[j].isTensor()) {
        settle_one(computed.toTensor(), results[j].toTensor());
      } else if (results[j].isTensorList()) {
        const auto targets = results[j].toTensorList();
        const auto values = computed.toTensorList();
        for (size_t k = 0; k < targets.size(); ++k) settle_one(values[k], targets[k]);
      }
    }
  }

  void settle_one(const at::Tensor& computed, const at::Tensor& target) const {
    if (!computed.defined() || !target.defined()) return;
    if (computed.sizes() != target.sizes() || computed.dtype() != target.dtype()) {
      // The caller already holds a result of the meta kernel's shape: it cannot change now.
      plan->meta_disagreed.store(true);
      TORCH_CHECK(false, "neuron: ", plan->name, " computed a result of shape ", computed.sizes(),
                  " and dtype ", computed.dtype(), " where its meta kernel said ", target.sizes(),
                  " and ", target.dtype(),
                  "; the op now runs inline. Please report this; NEURON_LAUNCH_BLOCKING=1 "
                  "avoids it");
    }
    const void* at = computed.storage().data();
    if (at == target.storage().data() && same_geometry(computed, target) &&
        computed.dtype() == target.dtype()) {
      return;
    }
    const char* begin = static_cast<const char*>(target.storage().data());
    const char* end = begin + target.storage().nbytes();
    const bool overlaps = at >= begin && at < end;
    target.copy_(overlaps ? computed.clone() : computed);
  }

  static void record(std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(g_error_mutex);
    if (!g_error) g_error = std::move(error);
    g_has_error.store(true);
  }
};

void run_launched(void* arg) {
  {
    std::unique_ptr<LaunchedOp> launched(static_cast<LaunchedOp*>(arg));
    launched->run();
  }  // its arguments and results are released here, on the worker
  g_pending.fetch_sub(1, std::memory_order_release);
}

}  // namespace

bool async_launches() {
  static const bool value = nrt_launch_blocking() == 0;
  return value;
}

bool on_stream_worker() { return tls_on_worker; }

bool launched_work_pending() { return g_pending.load(std::memory_order_acquire) != 0; }

bool async_candidate(size_t argument_bytes) {
  if (!async_launches() || tls_on_worker) return false;
  // A memory profile records allocations and frees on the thread that profiles.
  if (C10_UNLIKELY(c10::memoryProfilingEnabled())) return false;
  return g_pending.load(std::memory_order_relaxed) > 0 || argument_bytes >= min_async_bytes();
}

void raise_launch_error() {
  if (!g_has_error.load()) return;
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(g_error_mutex);
    error = std::exchange(g_error, nullptr);
    g_has_error.store(false);
  }
  if (error) std::rethrow_exception(error);
}

WaitingWithoutGil::WaitingWithoutGil() {
  if (Py_IsInitialized() != 0 && PyGILState_Check() != 0) {
    saved_ = PyEval_SaveThread();
  }
}

WaitingWithoutGil::~WaitingWithoutGil() {
  if (saved_ != nullptr) PyEval_RestoreThread(static_cast<PyThreadState*>(saved_));
}

bool wait_for_device_work() {
  if (tls_on_worker) return false;
  const bool pending = g_pending.load(std::memory_order_acquire) != 0;
  if (pending) {
    const c10::DeviceIndex count = device_count();
    nrt_status status = NRT_SUCCESS;
    {
      const WaitingWithoutGil no_gil;
      for (c10::DeviceIndex d = 0; d < count && status == NRT_SUCCESS; ++d) {
        status = nrt_device_synchronize(d);
      }
    }
    NEURON_CHECK(status);
  }
  raise_launch_error();
  return pending;
}

void wait_for_device_work(OpCounter& counter) {
  if (wait_for_device_work()) counter.synchronizing.fetch_add(1, std::memory_order_relaxed);
}

bool launch_async(const c10::OperatorHandle& op, torch::jit::Stack* stack, c10::DeviceIndex device,
                  uint64_t borrowed) {
  AsyncPlan& plan = plan_for(op);
  if (!plan.eligible || plan.meta_disagreed.load(std::memory_order_relaxed) ||
      plan.meta_failures.load(std::memory_order_relaxed) >= kMetaFailuresBeforeGivingUp) {
    return false;
  }
  const size_t num_args = op.schema().arguments().size();
  const size_t first = stack->size() - num_args;
  if (runs_inline_for_values(plan, *stack, first)) return false;

  // Shapes, dtypes and strides of the results: the meta kernel's, once per signature.
  const std::shared_ptr<const LaunchSpec> spec = launch_spec_for(op, plan, *stack, first, device);
  if (spec->inline_only) return false;
  if (!spec->resizes.empty()) {
    // The spec is cached by geometry: check that each out= argument is still without bytes.
    for (const OutputResize& resize : spec->resizes) {
      if ((*stack)[first + resize.argument].toTensor().storage().nbytes() != 0) return false;
    }
    for (const OutputResize& resize : spec->resizes) {
      (*stack)[first + resize.argument].toTensor().resize_(resize.sizes);
    }
  }

  auto launched =
      std::make_unique<LaunchedOp>(LaunchedOp{op,
                                              &plan,
                                              {},
                                              {},
                                              {},
                                              device,
                                              current_stream(device),
                                              worker_intra_op_threads(at::get_num_threads()),
                                              current_launch_correlation(),
                                              c10::GradMode::is_enabled(),
                                              c10::InferenceMode::is_enabled()});
  std::vector<c10::IValue> results;  // what the caller gets
  results.reserve(spec->results.size());
  Snapshots snapshots;
  for (size_t j = 0; j < spec->results.size(); ++j) {
    const ResultSpec& result = spec->results[j];
    switch (result.kind) {
      case ResultSpec::Kind::kAlias:
        results.push_back((*stack)[first + static_cast<size_t>(plan.return_aliases[j])]);
        launched->results.emplace_back();
        break;
      case ResultSpec::Kind::kTensor: {
        at::Tensor out = make_result(result.tensors[0], device);
        launched->results.emplace_back(snapshots(out));
        results.emplace_back(std::move(out));
        break;
      }
      case ResultSpec::Kind::kList: {
        c10::List<at::Tensor> outs;
        for (const TensorSpec& t : result.tensors) outs.push_back(make_result(t, device));
        launched->results.emplace_back(snapshots(c10::IValue(outs)));
        results.emplace_back(std::move(outs));
        break;
      }
      case ResultSpec::Kind::kNone:
        results.emplace_back();
        launched->results.emplace_back();
        break;
    }
  }
  for (const c10::IValue& result : launched->results) {
    auto reserve = [&](const at::Tensor& t) {
      if (t.defined() && t.storage().nbytes() > 0) {
        launched->reserved.push_back({t.storage().mutable_data(), t.storage().nbytes(), false});
      }
    };
    if (result.isTensor()) reserve(result.toTensor());
    if (result.isTensorList()) {
      for (const at::Tensor& t : result.toTensorList()) reserve(t);
    }
  }
  launched->stack.reserve(num_args);
  for (size_t i = 0; i < num_args; ++i) {
    launched->stack.push_back(snapshots((*stack)[first + i]));
  }

  LaunchedOp* task = launched.release();
  g_pending.fetch_add(1, std::memory_order_acq_rel);
  const nrt_status status =
      nrt_stream_launch(device, static_cast<int>(task->stream.id()), &run_launched, task);
  if (status != NRT_SUCCESS) {
    delete task;
    g_pending.fetch_sub(1, std::memory_order_release);
    NEURON_CHECK(status);
  }
  for (size_t i = 0; i < num_args && i < 64; ++i) {
    if ((borrowed >> i) & 1) {
      c10::MaybeOwnedTraits<c10::IValue>::destroyBorrow((*stack)[first + i]);
    }
  }
  stack->erase(stack->begin() + static_cast<std::ptrdiff_t>(first), stack->end());
  for (c10::IValue& result : results) stack->push_back(std::move(result));
  return true;
}

}  // namespace torchneuron
