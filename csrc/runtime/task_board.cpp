// The task board (task_board.h): a running kernel's tasks offered to the threads that would
// otherwise wait for it.
#include "task_board.h"

#include <chrono>
#include <thread>

#include "env.h"

namespace nrt {
namespace {
thread_local bool t_worker = false;  // a stream's worker thread
thread_local bool t_in_job = false;  // running a job's task (nested jobs run serially)
}  // namespace

TaskBoard& TaskBoard::instance() {
  static TaskBoard* board = new TaskBoard();  // never destroyed: workers may outlive statics
  return *board;
}

TaskBoard::TaskBoard() {
  enabled_.store(trim(get_env("TORCHNEURON_WAITERS_HELP").value_or("1")) != "0");
}

TaskBoard::WorkerThread::WorkerThread() {
  t_worker = true;
  instance().workers_.fetch_add(1);
}

TaskBoard::WorkerThread::~WorkerThread() {
  instance().workers_.fetch_sub(1);
  t_worker = false;
}

bool TaskBoard::shares_here() const {
  return enabled() && !t_in_job && (t_worker || workers_.load(std::memory_order_relaxed) > 0);
}

bool TaskBoard::may_help_here() const { return !t_in_job; }

int64_t TaskBoard::work_on(Job& job) {
  t_in_job = true;
  int64_t ran = 0;
  for (int64_t t = job.next.fetch_add(1); t < job.tasks; t = job.next.fetch_add(1), ++ran) {
    try {
      (*job.body)(t, t + 1);
    } catch (...) {  // kept for the poster; the other tasks still run
      std::lock_guard<std::mutex> lock(job.error_mutex);
      if (!job.error) job.error = std::current_exception();
    }
  }
  t_in_job = false;
  return ran;
}

void TaskBoard::run(int64_t tasks, const Body& body) {
  if (tasks <= 0) return;
  Job job;
  job.body = &body;
  job.tasks = tasks;
  bool posted = false;
  if (tasks > 1) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (job_ == nullptr) {
      job_ = &job;
      posted = true;
      jobs_posted_.fetch_add(1, std::memory_order_release);
    }
  }
  if (posted && waiting_.load() > 0) cv_.notify_all();
  work_on(job);
  if (posted) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = nullptr;  // no helper joins from here on
    }
    // Helpers still inside finish the task they took (every task has been handed out).
    while (job.helpers.load(std::memory_order_acquire) != 0) std::this_thread::yield();
  }
  if (job.error) std::rethrow_exception(job.error);
}

void TaskBoard::wait_helping(const std::function<bool()>& done) {
  std::unique_lock<std::mutex> lock(mutex_);
  waiting_.fetch_add(1);
  bool helped = false;
  while (!done()) {
    Job* job = job_;
    if (job != nullptr && job->next.load(std::memory_order_relaxed) < job->tasks) {
      job->helpers.fetch_add(1);
      lock.unlock();
      const int64_t ran = work_on(*job);
      helped_tasks_.fetch_add(static_cast<uint64_t>(ran), std::memory_order_relaxed);
      job->helpers.fetch_sub(1, std::memory_order_release);  // the job may be gone after this
      lock.lock();
      helped = true;
      continue;
    }
    if (helped) {
      // Kernels come in runs (a compiled graph's products, a step's launches) a few
      // microseconds apart, and a wake-up from cv_ costs tens of microseconds, a large part
      // of a decode product: watch for the next job briefly before sleeping.
      helped = false;
      const uint64_t seen = jobs_posted_.load(std::memory_order_acquire);
      lock.unlock();
      const auto spin_until = std::chrono::steady_clock::now() + kWatchAfterHelping;
      while (jobs_posted_.load(std::memory_order_acquire) == seen && !done() &&
             std::chrono::steady_clock::now() < spin_until) {
        std::this_thread::yield();
      }
      lock.lock();
      continue;
    }
    cv_.wait(lock);
  }
  waiting_.fetch_sub(1);
}

void TaskBoard::notify_waiters() {
  if (waiting_.load() == 0) return;
  // Taking the lock orders this after a waiter's evaluation of done(): it is either waiting
  // on cv_ already or will see the new state.
  {
    std::lock_guard<std::mutex> lock(mutex_);
  }
  cv_.notify_all();
}

}  // namespace nrt
