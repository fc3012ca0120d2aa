// Streams (stream.h): in-order queues with a worker thread each (or inline under
// NEURON_LAUNCH_BLOCKING=1), and the nrt_stream_* calls.
#include "stream.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "env.h"
#include "error.h"
#include "runtime_state.h"
#include "task_board.h"

namespace nrt {
namespace {
// Streams whose task is running on this thread, innermost last.
thread_local std::vector<const Stream*> t_running;
}  // namespace

Stream::Stream(int priority) : priority_(priority), asynchronous_(nrt_launch_blocking() == 0) {}

Stream::~Stream() {
  stopping_.store(true);
  TaskBoard::instance().notify_waiters();
  if (worker_.joinable()) worker_.join();
}

void Stream::enqueue(std::function<void()> task) {
  // A task that launches on its own stream (blocking-mode semantics) runs inline: queueing
  // it behind the running task would reorder it after work the task waits for.
  if (!asynchronous_ || running_on_this_thread()) {
    std::lock_guard<std::recursive_mutex> exec(exec_mutex_);
    Task inline_task{std::move(task), {}};
    {
      std::lock_guard<std::mutex> lock(mutex_);
      inline_task.waits.swap(waits_);
      launched_.fetch_add(1);
    }
    run_task(inline_task);
    return;
  }
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Task queued{std::move(task), {}};
    queued.waits.swap(waits_);
    queue_.push_back(std::move(queued));
    queued_.fetch_add(1);  // seq_cst: pairs with the sleeping worker's check (task_board.h)
    launched_.fetch_add(1);
    if (!worker_.joinable()) worker_ = std::thread([this] { worker_loop(); });
    wake = worker_sleeping_;
  }
  if (wake) TaskBoard::instance().notify_waiters();
}

void Stream::run_task(Task& task) {
  for (const auto& wait : task.waits) {
    // A stream that is gone was synchronized before it went (nrt_reset_for_testing).
    if (std::shared_ptr<Stream> source = wait.first.lock()) source->wait_reached(wait.second);
  }
  t_running.push_back(this);
  struct Finish {  // completes the task even if it throws, so waiters are never stranded
    Stream* stream;
    ~Finish() {
      t_running.pop_back();
      stream->mark_completed();
    }
  } finish{this};
  task.run();
}

void Stream::worker_loop() {
  const TaskBoard::WorkerThread worker;
  // A name that `top -H`, `perf` and /proc/<pid>/task/*/comm show, so a benchmark can check
  // that no worker runs while its CPU baseline does (benchmarks/_harness.py).
  pthread_setname_np(pthread_self(), kWorkerThreadName);
  for (;;) {
    // A launching thread usually sends the next task within microseconds: look for it
    // briefly before sleeping, which would cost a wake-up (two system calls) per task.
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
    while (queued_.load(std::memory_order_acquire) == 0 &&
           std::chrono::steady_clock::now() < spin_until) {
      std::this_thread::yield();
    }
    if (queued_.load() == 0) {
      // Asleep until work arrives, lending this thread to kernels others run meanwhile.
      {
        std::lock_guard<std::mutex> lock(mutex_);
        worker_sleeping_ = true;
      }
      TaskBoard::instance().wait_helping([&] { return stopping_.load() || queued_.load() != 0; });
    }
    Task task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      worker_sleeping_ = false;
      if (queue_.empty()) return;  // stopping, and nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
      queued_.fetch_sub(1, std::memory_order_release);
    }
    try {
      run_task(task);
    } catch (...) {
      // Callers catch their own errors inside the task (the runtime has no one to give
      // them to); an escaped one must not end the process from a worker thread.
    }
  }
}

void Stream::mark_completed() {
  std::vector<std::function<void()>> ready;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const uint64_t done = completed_.fetch_add(1) + 1;
    auto keep = std::partition(reached_hooks_.begin(), reached_hooks_.end(),
                               [done](const auto& hook) { return hook.first > done; });
    for (auto it = keep; it != reached_hooks_.end(); ++it) ready.push_back(std::move(it->second));
    reached_hooks_.erase(keep, reached_hooks_.end());
  }
  for (auto& callback : ready) callback();
  completed_cv_.notify_all();
  TaskBoard::instance().notify_waiters();
}

void Stream::add_wait(std::shared_ptr<Stream> source, uint64_t target) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    waits_.emplace_back(std::move(source), target);
  }
  // Asynchronously the wait is a queue entry of its own, so synchronize() and events
  // recorded after it cover it even if no other work is launched.
  if (asynchronous_) enqueue([] {});
}

void Stream::when_reached(uint64_t target, std::function<void()> callback) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_.load() < target) {
      reached_hooks_.emplace_back(target, std::move(callback));
      return;
    }
  }
  callback();
}

void Stream::wait_reached(uint64_t target) {
  if (completed_.load() >= target) return;
  TaskBoard& board = TaskBoard::instance();
  if (asynchronous_ && board.may_help_here()) {
    // The wait lends this thread to the kernel the worker runs (task_board.h).
    board.wait_helping([&] { return completed_.load() >= target; });
    return;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  completed_cv_.wait(lock, [&] { return completed_.load() >= target; });
}

bool Stream::running_on_this_thread() const {
  return std::find(t_running.begin(), t_running.end(), this) != t_running.end();
}

StreamSet::StreamSet() { streams_.push_back(std::make_shared<Stream>(0)); }

nrt_status StreamSet::create(int priority, const char* label, int* out_index) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (streams_.size() >= static_cast<size_t>(kMaxStreams)) {
    return fail(NRT_INVALID_ARGUMENT, std::string("nrt_stream_create: ") + label + " already has " +
                                          std::to_string(kMaxStreams) +
                                          " streams, the most a device can have");
  }
  streams_.push_back(std::make_shared<Stream>(priority));
  *out_index = static_cast<int>(streams_.size() - 1);
  return NRT_SUCCESS;
}

std::shared_ptr<Stream> StreamSet::get(int index) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (index < 0 || static_cast<size_t>(index) >= streams_.size()) return nullptr;
  return streams_[static_cast<size_t>(index)];
}

std::vector<std::shared_ptr<Stream>> StreamSet::all() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return streams_;
}

int StreamSet::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int>(streams_.size());
}

}  // namespace nrt

namespace {

nrt_status refuse_self_wait(const char* call, int device, int stream) {
  return nrt::fail(NRT_INVALID_ARGUMENT, std::string(call) + " was called from a task running on " +
                                             nrt::device_label(device) + " stream " +
                                             std::to_string(stream) +
                                             "; it would wait for itself forever");
}

}  // namespace

extern "C" nrt_status nrt_stream_create(int device, int priority, int* out_stream) {
  if (out_stream == nullptr) {
    return nrt::fail(NRT_INVALID_ARGUMENT, "nrt_stream_create: out_stream is NULL");
  }
  nrt::Device* dev = nullptr;
  if (nrt_status status = nrt::lookup_device(device, &dev)) return status;
  return dev->streams.create(priority, dev->label.c_str(), out_stream);
}

extern "C" nrt_status nrt_stream_launch(int device, int stream, nrt_task_fn fn, void* arg) {
  if (fn == nullptr) return nrt::fail(NRT_INVALID_ARGUMENT, "nrt_stream_launch: fn is NULL");
  std::shared_ptr<nrt::Stream> s;
  if (nrt_status status = nrt::lookup_stream(device, stream, &s)) return status;
  s->enqueue([fn, arg] { fn(arg); });
  return NRT_SUCCESS;
}

extern "C" nrt_status nrt_stream_synchronize(int device, int stream) {
  std::shared_ptr<nrt::Stream> s;
  if (nrt_status status = nrt::lookup_stream(device, stream, &s)) return status;
  if (s->running_on_this_thread())
    return refuse_self_wait("nrt_stream_synchronize", device, stream);
  s->synchronize();
  return NRT_SUCCESS;
}

extern "C" nrt_status nrt_stream_query(int device, int stream) {
  std::shared_ptr<nrt::Stream> s;
  if (nrt_status status = nrt::lookup_stream(device, stream, &s)) return status;
  return s->idle() ? NRT_SUCCESS : NRT_NOT_READY;
}

extern "C" nrt_status nrt_device_synchronize(int device) {
  nrt::Device* dev = nullptr;
  if (nrt_status status = nrt::lookup_device(device, &dev)) return status;
  const auto streams = dev->streams.all();
  for (size_t i = 0; i < streams.size(); ++i) {
    if (streams[i]->running_on_this_thread()) {
      return refuse_self_wait("nrt_device_synchronize", device, static_cast<int>(i));
    }
  }
  for (const auto& s : streams) s->synchronize();
  return NRT_SUCCESS;
}

extern "C" int nrt_launch_blocking(void) {
  return nrt::trim(nrt::get_env("NEURON_LAUNCH_BLOCKING").value_or("")) == "1" ? 1 : 0;
}
