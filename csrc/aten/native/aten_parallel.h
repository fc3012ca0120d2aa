// The native kernels' thread split (csrc/kernels' ParallelFor, which never starts threads
// of its own): with few intra-op threads, shared with the threads that wait
// (nrt::TaskBoard: the stream's worker and its caller); with more, served by
// at::parallel_for, i.e. PyTorch's intra-op pool.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <cstdint>
#include <functional>

#include "cpu_features.h"
#include "gemm.h"  // ParallelFor, serial_for
#include "task_board.h"

namespace torchneuron {

// Up to this many intra-op threads the task board serves kernels (the stream's worker and
// one waiting thread: as many cores, without competing with the caller's Python); beyond,
// PyTorch's pool has more threads to give.
constexpr int kBoardThreads = 2;

// The intra-op threads PyTorch's CPU kernels get on a stream's worker. libgomp gives every
// thread that opens a parallel region a team of its own, and once the teams of a process
// hold more threads than it has CPUs, every team's idle threads sleep at once instead of
// spinning, so each later region of every team (the caller's CPU work as much as the
// worker's) first waits for a wake-up: on a 2-vCPU KVM guest a 3 MFLOP torch.mm on the
// caller went from 18 to 90 us inside a kernel. Where the board already puts the worker's
// native kernels on every CPU, the worker opens no team (PyTorch's kernels run serially
// on it, the caller keeps the only one); with more CPUs, the caller's count. Small compiled
// graphs (decode steps) run with the same count on the caller: the idle worker gives their
// GEMVs the second core through the board, and a team of the caller's two threads beside it
// competed for that core (a 100M Llama's compiled float32 decode: 36 tok/s with torch's
// default two threads, 65 with one; hf_generate.py --compiled --threads 0 / 1).
inline int worker_intra_op_threads(int caller_threads) {
  static const int cpus = neuron::kernels::usable_cpus();
  return cpus <= kBoardThreads ? 1 : caller_threads;
}

// The OpenMP threads a large compiled graph runs with on the calling thread (small ones, such
// as decode steps, get worker_intra_op_threads: backend.py's _graph_threads). Where the board
// covers the host's CPUs, the device's core budget is the caller's and its worker's: the
// worker has nothing of its own while the caller runs a graph (it only helps the graph's
// native products), so the graph's Inductor kernels and the PyTorch kernels it calls get a
// team that size, as eager's kernels get the board. Elsewhere, the caller's count. Fixed by
// the host, not the launch mode, so a graph's code and results do not depend on the mode.
inline int compiled_graph_threads(int caller_threads) {
  static const int cpus = neuron::kernels::usable_cpus();
  return cpus <= kBoardThreads ? std::max(caller_threads, cpus) : caller_threads;
}

// The calling thread's OpenMP count is `threads` while this lives (PyTorch's CPU kernels read
// it; other threads keep theirs).
class OpenMpThreads {
 public:
#ifdef _OPENMP
  explicit OpenMpThreads(int threads) : saved_(omp_get_max_threads()) {
    if (threads != saved_) omp_set_num_threads(threads);
  }
  ~OpenMpThreads() {
    if (omp_get_max_threads() != saved_) omp_set_num_threads(saved_);
  }
#else
  explicit OpenMpThreads(int /*threads*/) {}  // without OpenMP every thread runs one
#endif
  OpenMpThreads(const OpenMpThreads&) = delete;
  OpenMpThreads& operator=(const OpenMpThreads&) = delete;

 private:
  int saved_ = 1;
};

// Runs body(t) for every t in [0, tasks) as tasks of the board (without one here, on this
// thread's OpenMP team), each on one OpenMP thread and under the posting thread's
// thread-local state: for tasks that call PyTorch's CPU kernels, whose checks read it (a
// helper outside inference mode refuses to write a result made inside it).
template <class Body>
void run_cpu_kernel_tasks(int64_t tasks, const Body& body) {
  const at::ThreadLocalState state;
  const auto run = [&](int64_t first, int64_t last) {
    for (int64_t t = first; t < last; ++t) {
      const at::ThreadLocalStateGuard poster_state(state);
      const OpenMpThreads one_thread(1);
      body(t);
    }
  };
  nrt::TaskBoard& board = nrt::TaskBoard::instance();
  if (board.shares_here()) {
    board.run(tasks, run);
  } else {
    at::parallel_for(0, tasks, 1, run);
  }
}

// at::parallel_for's threads for a problem of `work` units (multiply-adds, elements read)
// once it is at least `serial_below`; smaller ones, one thread, or a call already inside a
// parallel region run serially (a split would cost more than it saves).
inline neuron::kernels::ParallelFor aten_parallel(int64_t work, int64_t serial_below) {
  if (work < serial_below) return neuron::kernels::serial_for();
  nrt::TaskBoard& board = nrt::TaskBoard::instance();
  if (at::get_num_threads() <= kBoardThreads && board.shares_here()) {
    // Sized for the worker and one waiting thread; tasks go to whoever is free.
    neuron::kernels::ParallelFor par;
    par.threads = 2;
    par.run = [&board](int64_t tasks, const std::function<void(int64_t, int64_t)>& body) {
      board.run(tasks, body);
    };
    return par;
  }
  if (at::get_num_threads() <= 1 || at::in_parallel_region()) {
    return neuron::kernels::serial_for();
  }
  neuron::kernels::ParallelFor par;
  par.threads = at::get_num_threads();
  par.run = [](int64_t tasks, const std::function<void(int64_t, int64_t)>& body) {
    at::parallel_for(0, tasks, 1, [&](int64_t begin, int64_t end) { body(begin, end); });
  };
  return par;
}

// Elements per task of the elementwise and row kernels: a multiple of every vector width.
constexpr int64_t kElementsPerTask = 32768;

// fn(begin, end) over [0, units) in chunks of `grain` units, one chunk per task of
// aten_parallel (serial below 4 chunks' work). For kernels whose every unit (an element, a
// row) is computed alone: with grain a multiple of their vector width, each unit takes the
// same code path whatever the split, so results do not depend on who ran which chunk.
template <class Fn>
void parallel_chunks(int64_t units, int64_t grain, int64_t work_per_unit, Fn&& fn) {
  if (units <= 0) return;
  const int64_t tasks = (units + grain - 1) / grain;
  const neuron::kernels::ParallelFor par =
      aten_parallel(units * work_per_unit, 4 * grain * work_per_unit);
  par.run(tasks,
          [&](int64_t first, int64_t last) { fn(first * grain, std::min(units, last * grain)); });
}

}  // namespace torchneuron
