// nrt::TaskBoard: a kernel's tasks shared with threads that wait (task_board.h).
#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "runtime_test_support.h"
#include "task_board.h"

namespace {

using nrt::TaskBoard;
// A reset runtime per test: no stream worker of an earlier test is left to join a job.
using TaskBoardTest = RuntimeTest;
using Clock = std::chrono::steady_clock;

// Records which thread ran each task; a task waits (up to 10 s) until two threads have
// started tasks, so a job of more tasks than one thread takes is provably split.
struct Rendezvous {
  explicit Rendezvous(int64_t tasks) : runs(static_cast<size_t>(tasks)) {
    for (auto& r : runs) r.store(0);
  }
  void operator()(int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      runs[static_cast<size_t>(t)].fetch_add(1);
      {
        std::lock_guard<std::mutex> lock(mutex);
        threads.insert(std::this_thread::get_id());
      }
      const auto give_up = Clock::now() + std::chrono::seconds(10);
      while (thread_count() < 2 && Clock::now() < give_up) std::this_thread::yield();
    }
  }
  size_t thread_count() {
    std::lock_guard<std::mutex> lock(mutex);
    return threads.size();
  }
  std::vector<std::atomic<int>> runs;
  std::mutex mutex;
  std::set<std::thread::id> threads;
};

// A worker thread running `job` while the test's thread waits for it, helping.
template <typename Job>
void run_on_worker_while_waiting(Job job) {
  TaskBoard& board = TaskBoard::instance();
  std::atomic<bool> finished{false};
  std::thread worker([&] {
    const TaskBoard::WorkerThread marked;
    job();
    finished.store(true);
    board.notify_waiters();
  });
  ASSERT_TRUE(board.may_help_here());
  board.wait_helping([&] { return finished.load(); });
  worker.join();
}

TEST_F(TaskBoardTest, AWaitingThreadRunsTasksOfTheWorkersJob) {
  TaskBoard& board = TaskBoard::instance();
  Rendezvous rendezvous(16);
  const uint64_t helped_before = board.helped_tasks();
  bool shared = false;
  run_on_worker_while_waiting([&] {
    shared = board.shares_here();
    board.run(16, std::ref(rendezvous));
  });
  EXPECT_TRUE(shared);
  EXPECT_EQ(rendezvous.thread_count(), 2u);
  for (const auto& r : rendezvous.runs) EXPECT_EQ(r.load(), 1);  // each task exactly once
  EXPECT_GT(board.helped_tasks(), helped_before);
  EXPECT_LT(board.helped_tasks() - helped_before, 16u);  // the worker ran some itself
}

TEST_F(TaskBoardTest, AnIdleWorkerRunsTasksOfTheCallersJob) {
  // The stream worker sleeps in wait_helping; the caller's own kernel is shared with it.
  ASSERT_NRT_OK(nrt_init());
  auto wake = +[](void*) {};
  ASSERT_NRT_OK(nrt_stream_launch(0, 0, wake, nullptr));  // starts the worker
  ASSERT_NRT_OK(nrt_stream_synchronize(0, 0));
  TaskBoard& board = TaskBoard::instance();
  ASSERT_TRUE(board.shares_here());
  Rendezvous rendezvous(16);
  board.run(16, std::ref(rendezvous));
  EXPECT_EQ(rendezvous.thread_count(), 2u);
  for (const auto& r : rendezvous.runs) EXPECT_EQ(r.load(), 1);
}

TEST_F(TaskBoardTest, SynchronizeHelpsAKernelRunningOnTheStream) {
  ASSERT_NRT_OK(nrt_init());
  TaskBoard& board = TaskBoard::instance();
  Rendezvous rendezvous(16);
  std::atomic<bool> shared{false};
  auto kernel = [&] {
    shared.store(board.shares_here());
    board.run(16, std::ref(rendezvous));
  };
  using Kernel = decltype(kernel);
  ASSERT_NRT_OK(
      nrt_stream_launch(0, 0, [](void* arg) { (*static_cast<Kernel*>(arg))(); }, &kernel));
  ASSERT_NRT_OK(nrt_stream_synchronize(0, 0));
  EXPECT_TRUE(shared.load());
  EXPECT_EQ(rendezvous.thread_count(), 2u);
  for (const auto& r : rendezvous.runs) EXPECT_EQ(r.load(), 1);
}

TEST_F(TaskBoardTest, AHelpersExceptionReachesThePosterAfterEveryTask) {
  TaskBoard& board = TaskBoard::instance();
  const std::thread::id waiting_thread = std::this_thread::get_id();
  Rendezvous rendezvous(8);
  std::atomic<int> helper_tasks{0};
  bool rethrown = false;
  run_on_worker_while_waiting([&] {
    try {
      board.run(8, [&](int64_t begin, int64_t end) {
        rendezvous(begin, end);
        if (std::this_thread::get_id() == waiting_thread) {
          helper_tasks.fetch_add(1);
          throw std::runtime_error("task failed on the helper");
        }
      });
    } catch (const std::runtime_error& error) {
      rethrown = std::string(error.what()) == "task failed on the helper";
    }
  });
  EXPECT_GT(helper_tasks.load(), 0);
  EXPECT_TRUE(rethrown);
  for (const auto& r : rendezvous.runs) EXPECT_EQ(r.load(), 1);  // the others still ran
}

TEST_F(TaskBoardTest, NestedJobsAndDisabledSharingRunOnTheCaller) {
  TaskBoard& board = TaskBoard::instance();
  std::atomic<int> nested_shares{0}, tasks_run{0};
  run_on_worker_while_waiting([&] {
    board.run(4, [&](int64_t, int64_t) {
      tasks_run.fetch_add(1);
      if (board.shares_here()) nested_shares.fetch_add(1);
    });
  });
  EXPECT_EQ(tasks_run.load(), 4);
  EXPECT_EQ(nested_shares.load(), 0);  // inside a task, on either thread, a split is serial

  board.set_enabled(false);
  bool shared = true;
  run_on_worker_while_waiting([&] { shared = board.shares_here(); });
  board.set_enabled(true);
  EXPECT_FALSE(shared);
}

}  // namespace
