// Kernels split between the threads that would otherwise wait. A caller blocked on device
// work (synchronize, an event, a host read) takes tasks of the kernel the stream's worker
// runs; an idle worker takes tasks of a kernel the caller runs itself (a compiled graph, an
// op that stays inline). So a kernel uses a second core exactly when its owner's partner
// has nothing else to do, and never competes with Python and dispatch.
//
// One job is on the board at a time (a second poster runs its own tasks alone); a job's
// tasks must be independent and give the same result on any thread. Tasks are handed out
// one at a time, so a helper that arrives late only changes who runs them.
//
// A thread that just helped watches the board for kWatchAfterHelping before it sleeps:
// products come in runs a few microseconds apart (a compiled decode step's 57 GEMVs), and
// waking from the condition variable took a large part of each one, so the idle worker
// ran 28% of a compiled step's GEMV tasks instead of about half.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>

namespace nrt {

class TaskBoard {
 public:
  using Body = std::function<void(int64_t begin, int64_t end)>;

  static TaskBoard& instance();

  // True if run() may find helpers: sharing is enabled, the calling thread runs no job's
  // task, and it is a stream worker (callers wait for it) or a worker exists (it waits
  // for work while idle). Without asynchronous streams no thread ever waits.
  bool shares_here() const;
  // Runs body(t, t + 1) for every t in [0, tasks): on the calling thread and on any thread
  // waiting in wait_helping() meanwhile. Returns once all have run; rethrows the first
  // exception a task threw (after every task has run).
  void run(int64_t tasks, const Body& body);

  // True if the calling thread may help: it runs no job's task.
  bool may_help_here() const;
  // Blocks until done() holds, running posted tasks meanwhile. done() is evaluated with the
  // board's lock held, and also without it right after helping (so it must only read
  // atomics); whoever makes it true must call notify_waiters() afterwards.
  void wait_helping(const std::function<bool()>& done);
  // Wakes threads in wait_helping() to re-evaluate their condition (cheap when none wait).
  void notify_waiters();

  // TORCHNEURON_WAITERS_HELP=0 disables sharing; also settable at run time (benchmarks).
  void set_enabled(bool enabled) { enabled_.store(enabled, std::memory_order_relaxed); }
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  // Whether a stream worker exists (one that is idle helps the kernels callers run).
  bool has_workers() const { return workers_.load(std::memory_order_relaxed) > 0; }
  // Tasks run by helpers since the process started (diagnostics and tests).
  uint64_t helped_tasks() const { return helped_tasks_.load(std::memory_order_relaxed); }

  // Marks the calling thread as a stream worker while it lives (Stream's worker loop).
  class WorkerThread {
   public:
    WorkerThread();
    ~WorkerThread();
    WorkerThread(const WorkerThread&) = delete;
    WorkerThread& operator=(const WorkerThread&) = delete;
  };

 private:
  struct Job {
    const Body* body = nullptr;
    int64_t tasks = 0;
    std::atomic<int64_t> next{0};
    std::atomic<int> helpers{0};  // helpers inside the job; the poster waits for zero
    std::mutex error_mutex;
    std::exception_ptr error;
  };

  TaskBoard();
  // Runs the job's tasks until none is left; returns how many this thread ran.
  static int64_t work_on(Job& job);

  // How long a thread that just helped watches for the next job before sleeping.
  static constexpr std::chrono::microseconds kWatchAfterHelping{100};

  std::mutex mutex_;
  std::condition_variable cv_;
  Job* job_ = nullptr;                    // guarded by mutex_
  std::atomic<int> waiting_{0};           // threads in wait_helping()
  std::atomic<uint64_t> jobs_posted_{0};  // what a watching thread watches
  std::atomic<int> workers_{0};           // live WorkerThread scopes
  std::atomic<bool> enabled_{true};
  std::atomic<uint64_t> helped_tasks_{0};
};

}  // namespace nrt
