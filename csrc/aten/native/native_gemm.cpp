// mm, addmm and bmm on the neuron device through the native GEMM/GEMV (csrc/kernels/gemm.h),
// which reads device memory in place (it is host-addressable) and writes the result into a
// fresh device tensor. Float32 and bfloat16 strided tensors take this path; everything
// else (other dtypes, mixed devices, bad shapes, whose errors PyTorch's kernel words) runs
// PyTorch's CPU kernel over host aliases as every other op does.
//
// The same kernels back torchneuron::native_mm / native_addmm / native_bmm, custom ops with
// CPU kernels that the neuron compile backend puts in place of aten.mm/addmm/bmm: compiled
// graphs run on the host over aliases of device memory, so their matmuls are CPU calls.
#include <ATen/ExpandUtils.h>
#include <ATen/Functions.h>
#include <ATen/Operators.h>
#include <torch/library.h>

#include <atomic>
#include <optional>

#include "device/device_placement.h"
#include "fma_peak.h"
#include "gemm.h"
#include "host_kernels/host_kernel_executor.h"
#include "launch/async_launch.h"
#include "memory/allocation_redirect.h"
#include "memory/device_storage.h"
#include "native/aten_parallel.h"
#include "native/gemm_route.h"
#include "native/native_kernel_switch.h"
#include "op_registrations.h"
#include "ops/op_tracking.h"
#include "profiler/device_activity.h"
#include "task_board.h"

namespace torchneuron {
namespace {

namespace nk = neuron::kernels;

std::atomic<int64_t> native_gemm_calls{0};

std::optional<nk::GemmDtype> gemm_dtype(at::ScalarType type) {
  if (type == at::kFloat) return nk::GemmDtype::kFloat32;
  if (type == at::kBFloat16) return nk::GemmDtype::kBFloat16;
  return std::nullopt;
}

// Whether the native kernel can read `t` in place: a plain strided tensor of `device`
// and `dtype` with `dim` dimensions.
bool readable(const at::Tensor& t, const at::Device& device, at::ScalarType dtype, int64_t dim) {
  return t.defined() && t.device() == device && t.scalar_type() == dtype && t.dim() == dim &&
         t.layout() == at::kStrided && !t.is_conj() && !t.is_neg() &&
         (t.numel() == 0 || t.const_data_ptr() != nullptr);
}

nk::MatrixRef matrix(const at::Tensor& t) {
  const int64_t d = t.dim();
  return {t.const_data_ptr(), t.stride(d - 2), t.stride(d - 1), d == 3 ? t.stride(0) : 0};
}

// Serial below ~128K multiply-adds: a split would cost more than it saves.
constexpr int64_t kSerialBelowMultiplyAdds = int64_t{1} << 17;

// out = alpha · a·b + beta · bias over 2-D or 3-D (batched) tensors already checked.
void compute_gemm(const at::Tensor& a, const at::Tensor& b, const at::Tensor* bias, float alpha,
                  float beta, at::Tensor& out) {
  const bool batched = a.dim() == 3;
  nk::GemmProblem p;
  p.batch = batched ? a.size(0) : 1;
  p.m = a.size(-2);
  p.k = a.size(-1);
  p.n = b.size(-1);
  p.dtype = *gemm_dtype(a.scalar_type());
  p.a = matrix(a);
  p.b = matrix(b);
  if (bias != nullptr) p.bias = matrix(*bias);
  p.c = out.data_ptr();
  p.c_row_stride = out.stride(-2);
  p.c_batch_stride = batched ? out.stride(0) : 0;
  p.alpha = alpha;
  p.beta = beta;
  if (out.numel() == 0) return;
  nk::gemm(p, aten_parallel(p.batch * p.m * p.n * p.k, kSerialBelowMultiplyAdds));
}

// compute_gemm, counted as a product of the program (gemm_route's timing runs are not).
void run_gemm(const at::Tensor& a, const at::Tensor& b, const at::Tensor* bias, float alpha,
              float beta, at::Tensor& out) {
  compute_gemm(a, b, bias, alpha, beta, out);
  native_gemm_calls.fetch_add(1, std::memory_order_relaxed);
}

// The product's shape when the native kernel can compute it, else nullopt.
std::optional<std::vector<int64_t>> native_shape(const at::Tensor& a, const at::Tensor& b,
                                                 int64_t dim) {
  if (!native_kernels_enabled() || !a.defined() || !gemm_dtype(a.scalar_type())) return {};
  if (!readable(a, a.device(), a.scalar_type(), dim) ||
      !readable(b, a.device(), a.scalar_type(), dim)) {
    return {};
  }
  if (a.size(-1) != b.size(-2) || (dim == 3 && a.size(0) != b.size(0))) return {};
  if (!nk::gemm_preferred(*gemm_dtype(a.scalar_type()), a.size(-2), b.size(-1), nk::isa_level())) {
    return {};
  }
  if (dim == 3) return std::vector<int64_t>{a.size(0), a.size(1), b.size(2)};
  return std::vector<int64_t>{a.size(0), b.size(1)};
}

// ---- products PyTorch's CPU library computes, shared over the board --------------------

// Where the board covers the host's CPUs the worker runs PyTorch's CPU kernels on one
// thread (worker_intra_op_threads), so a product left to the library (oneDNN for the bf16
// products gemm_preferred does not take on AVX512-BF16/AMX hosts, MKL for the float32
// classes it was measured faster for, gemm_route.h) would leave a waiting caller's core idle.
// Their output rows are split in two tasks instead, each a one-thread library product, run
// on the board (or, without one, on the calling thread's OpenMP team); the split is fixed,
// so the result does not depend on who ran which task, on sharing or on the launch mode.
constexpr int64_t kBoardProductTasks = 2;
// Smaller products stay one library call: a chosen size (32x the native kernels' serial
// bound, kSerialBelowMultiplyAdds), not a measured crossover.
constexpr int64_t kBoardProductBelowMultiplyAdds = int64_t{1} << 22;

// Whether a 2-D product (and its addmm bias) can be computed as the library's row tasks.
bool shareable_library_product(const at::Tensor& a, const at::Tensor& b, const at::Tensor* bias) {
  const at::ScalarType dtype = a.scalar_type();
  if (!native_kernels_enabled() || !readable(a, a.device(), dtype, 2) ||
      !readable(b, a.device(), dtype, 2) || a.size(1) != b.size(0)) {
    return false;
  }
  if (bias != nullptr) {
    // a bias PyTorch's kernel would refuse stays with it, so its error is PyTorch's
    if (!readable(*bias, a.device(), dtype, bias->dim()) || bias->dim() > 2) return false;
    const std::vector<int64_t> shape{a.size(0), b.size(1)};
    if (!at::is_expandable_to(bias->sizes(), shape)) return false;
  }
  const int64_t m = a.size(0);
  if (m < 2 * kBoardProductTasks || m * a.size(1) * b.size(1) < kBoardProductBelowMultiplyAdds) {
    return false;
  }
  // Decided by the thread count alone, which launch modes and sharing leave on the same side
  // of kBoardThreads (worker_intra_op_threads): the rows a task computes, and so the
  // result, do not depend on them.
  return at::get_num_threads() <= kBoardThreads;
}

bool takes_shared_onednn_product(const at::Tensor& a, const at::Tensor& b, const at::Tensor* bias) {
  return a.scalar_type() == at::kBFloat16 && a.dim() == 2 && b.dim() == 2 &&
         !nk::gemm_preferred(nk::GemmDtype::kBFloat16, a.size(0), b.size(-1), nk::isa_level()) &&
         shareable_library_product(a, b, bias);
}

// out = mm (bias undefined) or addmm of host tensors, the rows split in fixed tasks.
void shared_library_rows(const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias,
                         const at::Scalar& beta, const at::Scalar& alpha, at::Tensor& out) {
  const int64_t m = a.size(0);
  const c10::DispatchKeySet cpu(c10::DispatchKey::CPU);
  run_cpu_kernel_tasks(kBoardProductTasks, [&](int64_t task) {
    const int64_t begin = m * task / kBoardProductTasks;
    const int64_t rows = m * (task + 1) / kBoardProductTasks - begin;
    at::Tensor part = out.narrow(0, begin, rows);
    const at::Tensor part_a = a.narrow(0, begin, rows);
    if (!bias.defined()) {
      at::_ops::mm_out::redispatch(cpu, part_a, b, part);
      return;
    }
    const bool per_row = bias.dim() == 2 && bias.size(0) == m && m > 1;
    const at::Tensor part_bias = per_row ? bias.narrow(0, begin, rows) : bias;
    at::_ops::addmm_out::redispatch(cpu, part_bias, part_a, b, beta, alpha, part);
  });
}

// The same for neuron tensors, over their host aliases.
at::Tensor shared_library_product(const char* name, OpCounter& counter, const at::Tensor& a,
                                  const at::Tensor& b, const at::Tensor* bias,
                                  const at::Scalar& beta, const at::Scalar& alpha) {
  HostKernelCall call(a.device().index(), &counter);
  const at::Tensor host_a = call.to_host(a), host_b = call.to_host(b);
  const at::Tensor host_bias = bias != nullptr ? call.to_host(*bias) : at::Tensor();
  at::Tensor result = call.run(name, [&] {
    at::Tensor out = at::empty({a.size(0), b.size(1)}, host_a.options());  // device memory
    shared_library_rows(host_a, host_b, host_bias, beta, alpha, out);
    return out;
  });
  counter.executed.fetch_add(1, std::memory_order_relaxed);
  return call.adopt(std::move(result));
}

// Whether a float32 product the native GEMM could compute belongs to a class the library
// was measured faster for (gemm_route.h). The measurement computes the plain product of the
// call's own operands (host aliases) into scratch memory, both kernels as they would run.
bool library_measured_faster(const at::Tensor& a, const at::Tensor& b, const at::Tensor* bias) {
  if (a.scalar_type() != at::kFloat || !shareable_library_product(a, b, bias)) return false;
  const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
  if (m * n * k < kRoutedAboveMultiplyAdds) return false;
  const auto transposed = [](const at::Tensor& t) { return t.stride(1) != 1 && t.size(1) > 1; };
  const ProductClass cls = product_class(m, n, k, transposed(a), transposed(b));
  std::optional<HostAliasSet> aliases;
  at::Tensor host_a, host_b, scratch;
  const auto prepare = [&] {
    if (scratch.defined()) return;
    aliases.emplace();
    const auto host = [&](const at::Tensor& t) {
      return is_device_tensor(t) ? aliases->alias(t) : t;
    };
    host_a = host(a);
    host_b = host(b);
    scratch = at::empty({m, n}, host_a.options().device(at::kCPU));
  };
  const auto run_native = [&] {
    prepare();
    compute_gemm(host_a, host_b, nullptr, 1.0f, 0.0f, scratch);
  };
  const auto run_library = [&] {
    prepare();
    shared_library_rows(host_a, host_b, at::Tensor(), 0, 1, scratch);
  };
  return gemm_route(cls, run_native, run_library) == GemmRoute::kLibrary;
}

// ---- eager neuron kernels --------------------------------------------------------------

// PyTorch's CPU kernel over host aliases, for what the native kernel does not take.
template <class Op, class... Args>
at::Tensor on_host(const char* name, const Args&... args) {
  static OpCounter& counter = op_counter_named(name);
  DevicePlacement placement(name);
  auto visit = [&](const auto& value) {
    if constexpr (std::is_same_v<std::decay_t<decltype(value)>, at::Tensor>) placement.visit(value);
  };
  (visit(args), ...);
  HostKernelCall call(placement.device(), &counter);
  auto host = [&](const auto& value) {
    if constexpr (std::is_same_v<std::decay_t<decltype(value)>, at::Tensor>) {
      return call.to_host(value);
    } else {
      return value;
    }
  };
  at::Tensor result = call.run(name, [&] {
    return Op::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), host(args)...);
  });
  counter.executed.fetch_add(1, std::memory_order_relaxed);
  return call.adopt(std::move(result));
}

at::Tensor native_product(const char* name, OpCounter& counter, const at::Tensor& a,
                          const at::Tensor& b, const std::vector<int64_t>& shape,
                          const at::Tensor* bias, float alpha, float beta) {
  at::Tensor out = empty_device_tensor(shape, a);
  {
    const DeviceActivitySpan span(DeviceActivityKind::kKernel, name, a.device().index());
    run_gemm(a, b, bias, alpha, beta, out);
  }
  counter.executed.fetch_add(1, std::memory_order_relaxed);
  return out;
}

at::Tensor neuron_mm(const at::Tensor& self, const at::Tensor& mat2) {
  if (auto launched = launch_or_wait<at::_ops::mm>(self, mat2)) return *launched;
  const auto shape = native_shape(self, mat2, 2);
  static OpCounter& counter = op_counter_named("aten::mm");
  if (shape ? library_measured_faster(self, mat2, nullptr)
            : takes_shared_onednn_product(self, mat2, nullptr)) {
    return shared_library_product("aten::mm", counter, self, mat2, nullptr, 0, 1);
  }
  if (!shape) return on_host<at::_ops::mm>("aten::mm", self, mat2);
  return native_product("aten::mm", counter, self, mat2, *shape, nullptr, 1.0f, 0.0f);
}

at::Tensor neuron_bmm(const at::Tensor& self, const at::Tensor& mat2) {
  if (auto launched = launch_or_wait<at::_ops::bmm>(self, mat2)) return *launched;
  const auto shape = native_shape(self, mat2, 3);
  if (!shape) return on_host<at::_ops::bmm>("aten::bmm", self, mat2);
  static OpCounter& counter = op_counter_named("aten::bmm");
  return native_product("aten::bmm", counter, self, mat2, *shape, nullptr, 1.0f, 0.0f);
}

// addmm's bias broadcast to the product's shape (a view), or nullopt if it cannot be read.
std::optional<at::Tensor> addmm_bias(const at::Tensor& bias, const at::Tensor& mat1,
                                     const std::vector<int64_t>& shape) {
  if (!bias.defined() || bias.device() != mat1.device() ||
      bias.scalar_type() != mat1.scalar_type() || bias.dim() > 2 || bias.layout() != at::kStrided ||
      bias.is_conj() || bias.is_neg()) {
    return std::nullopt;
  }
  const auto expanded = at::infer_size(bias.sizes(), shape);  // throws if not broadcastable
  if (expanded != at::IntArrayRef(shape)) return std::nullopt;
  return bias.expand(shape);
}

bool float_scalar(const at::Scalar& s) { return !s.isComplex(); }

// addmm's bias as the native kernel reads it, or nullopt where PyTorch's kernel takes over
// (complex scalars, non-broadcastable bias: PyTorch's kernel words that error).
std::optional<at::Tensor> native_addmm_bias(const at::Tensor& self, const at::Tensor& mat1,
                                            const std::optional<std::vector<int64_t>>& shape,
                                            const at::Scalar& beta, const at::Scalar& alpha) {
  if (!shape || !float_scalar(beta) || !float_scalar(alpha)) return std::nullopt;
  try {
    return addmm_bias(self, mat1, *shape);
  } catch (const c10::Error&) {
    return std::nullopt;
  }
}

at::Tensor neuron_addmm(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2,
                        const at::Scalar& beta, const at::Scalar& alpha) {
  if (auto launched = launch_or_wait<at::_ops::addmm>(self, mat1, mat2, beta, alpha)) {
    return *launched;
  }
  const auto shape = native_shape(mat1, mat2, 2);
  const auto bias = native_addmm_bias(self, mat1, shape, beta, alpha);
  static OpCounter& counter = op_counter_named("aten::addmm");
  if (bias ? library_measured_faster(mat1, mat2, &self)
           : float_scalar(beta) && float_scalar(alpha) &&
                 takes_shared_onednn_product(mat1, mat2, &self)) {
    return shared_library_product("aten::addmm", counter, mat1, mat2, &self, beta, alpha);
  }
  if (!bias) return on_host<at::_ops::addmm>("aten::addmm", self, mat1, mat2, beta, alpha);
  return native_product("aten::addmm", counter, mat1, mat2, *shape, &*bias, alpha.to<float>(),
                        beta.to<float>());
}

// ---- custom ops for compiled graphs (CPU tensors) ---------------------------------------

// A compiled graph's product the library computes (bf16 by oneDNN, float32 classes routed
// to MKL), its rows over the board.
at::Tensor cpu_shared_library_product(const at::Tensor& a, const at::Tensor& b,
                                      const at::Tensor* bias, const at::Scalar& beta,
                                      const at::Scalar& alpha) {
  at::Tensor out = at::empty({a.size(0), b.size(1)}, a.options());
  shared_library_rows(a, b, bias != nullptr ? *bias : at::Tensor(), beta, alpha, out);
  return out;
}

at::Tensor cpu_native_mm(const at::Tensor& self, const at::Tensor& mat2) {
  const auto shape = native_shape(self, mat2, 2);
  if (shape ? library_measured_faster(self, mat2, nullptr)
            : takes_shared_onednn_product(self, mat2, nullptr)) {
    return cpu_shared_library_product(self, mat2, nullptr, 0, 1);
  }
  if (!shape) return at::mm(self, mat2);
  at::Tensor out = at::empty(*shape, self.options());
  run_gemm(self, mat2, nullptr, 1.0f, 0.0f, out);
  return out;
}

at::Tensor cpu_native_bmm(const at::Tensor& self, const at::Tensor& mat2) {
  const auto shape = native_shape(self, mat2, 3);
  if (!shape) return at::bmm(self, mat2);
  at::Tensor out = at::empty(*shape, self.options());
  run_gemm(self, mat2, nullptr, 1.0f, 0.0f, out);
  return out;
}

at::Tensor cpu_native_addmm(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2,
                            const at::Scalar& beta, const at::Scalar& alpha) {
  const auto shape = native_shape(mat1, mat2, 2);
  const auto bias = native_addmm_bias(self, mat1, shape, beta, alpha);
  if (bias ? library_measured_faster(mat1, mat2, &self)
           : float_scalar(beta) && float_scalar(alpha) &&
                 takes_shared_onednn_product(mat1, mat2, &self)) {
    return cpu_shared_library_product(mat1, mat2, &self, beta, alpha);
  }
  if (!bias) return at::addmm(self, mat1, mat2, beta, alpha);
  at::Tensor out = at::empty(*shape, mat1.options());
  run_gemm(mat1, mat2, &*bias, alpha.to<float>(), beta.to<float>(), out);
  return out;
}

}  // namespace

void register_native_gemm(torch::Library& m) {
  m.impl("mm", TORCH_FN(neuron_mm));
  m.impl("bmm", TORCH_FN(neuron_bmm));
  m.impl("addmm", TORCH_FN(neuron_addmm));
}

void define_native_gemm_ops(torch::Library& m) {
  m.def("native_mm(Tensor self, Tensor mat2) -> Tensor");
  m.def("native_bmm(Tensor self, Tensor mat2) -> Tensor");
  m.def(
      "native_addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) "
      "-> Tensor");
  // How many products the native GEMM computed in this process (tests, benchmarks).
  m.def("native_gemm_calls() -> int", [] {
    wait_for_device_work();  // count launched products too
    return native_gemm_calls.load();
  });
  // Whether a product of this dtype, rows and columns takes the native GEMM (else oneDNN).
  m.def("native_gemm_preferred(ScalarType dtype, int m, int n) -> bool", [](c10::ScalarType dtype,
                                                                            int64_t m, int64_t n) {
    const auto native = gemm_dtype(dtype);
    return native_kernels_enabled() && native && nk::gemm_preferred(*native, m, n, nk::isa_level());
  });
  // The float32 product classes routed by measurement in this process (gemm_route.h).
  m.def("gemm_routes() -> str[]", [] { return decided_gemm_routes(); });
  // One core's measured multiply-add peak (flop/s) at the kernels' ISA (benchmarks/gemm.py).
  m.def("fma_peak_flops(bool bf16, int iterations) -> float", [](bool bf16, int64_t iterations) {
    return neuron::kernels::fma_peak_flops(bf16, neuron::kernels::isa_level(), iterations);
  });
}

void register_native_gemm_ops_cpu(torch::Library& m) {
  m.impl("native_mm", TORCH_FN(cpu_native_mm));
  m.impl("native_bmm", TORCH_FN(cpu_native_bmm));
  m.impl("native_addmm", TORCH_FN(cpu_native_addmm));
}

void register_native_gemm_ops_neuron(torch::Library& m) {
  m.impl("native_mm", TORCH_FN(neuron_mm));
  m.impl("native_bmm", TORCH_FN(neuron_bmm));
  m.impl("native_addmm", TORCH_FN(neuron_addmm));
}

}  // namespace torchneuron
