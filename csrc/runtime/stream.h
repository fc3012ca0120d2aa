// In-order work queues. A Stream counts launched and completed tasks; events and waits refer
// to positions in that count. By default a stream is asynchronous: enqueue() hands the task
// to the stream's worker thread (started on first use) and returns. With
// NEURON_LAUNCH_BLOCKING=1 (read when the stream is created) enqueue() runs the task on the
// caller's thread before returning, as the first implementation did.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "neuron_runtime.h"

namespace nrt {

// The name of every stream's worker thread (at most 15 characters: the kernel's limit).
inline constexpr char kWorkerThreadName[] = "neuron-stream";

class Stream {
 public:
  explicit Stream(int priority);
  // Joins the worker; the runtime destroys streams only after synchronizing them.
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  int priority() const { return priority_; }
  bool asynchronous() const { return asynchronous_; }
  uint64_t launched() const { return launched_.load(); }
  uint64_t completed() const { return completed_.load(); }
  bool idle() const { return completed() == launched(); }

  // Runs `task` after all earlier work on this stream and after every pending event wait.
  // A task that throws still counts as completed; callers that need its error catch it
  // inside the task.
  void enqueue(std::function<void()> task);
  // Later tasks first wait until `source` has completed `target` tasks.
  void add_wait(std::shared_ptr<Stream> source, uint64_t target);
  // Calls `callback` once `target` tasks have completed (immediately if they have).
  void when_reached(uint64_t target, std::function<void()> callback);
  // Blocks until `target` tasks have completed.
  void wait_reached(uint64_t target);
  // Blocks until all work launched so far has completed.
  void synchronize() { wait_reached(launched()); }
  // True while a task of this stream runs on the calling thread (waiting would deadlock).
  bool running_on_this_thread() const;

 private:
  // Weak for the reason EventState::stream is: a worker must not destroy a stream.
  using Waits = std::vector<std::pair<std::weak_ptr<Stream>, uint64_t>>;
  struct Task {
    std::function<void()> run;
    Waits waits;  // stream positions to reach before running
  };

  void run_task(Task& task);
  void worker_loop();
  void mark_completed();

  const int priority_;
  const bool asynchronous_;
  std::atomic<uint64_t> launched_{0};
  std::atomic<uint64_t> completed_{0};  // written under mutex_
  std::recursive_mutex exec_mutex_;     // serialises tasks (recursive: tasks may launch)
  std::mutex mutex_;
  std::condition_variable completed_cv_;
  Waits waits_;                                                            // guarded by mutex_
  std::vector<std::pair<uint64_t, std::function<void()>>> reached_hooks_;  // guarded by mutex_
  // Asynchronous mode: tasks not yet taken by the worker, and the worker itself.
  // The worker sleeps in TaskBoard::wait_helping (it may run others' kernel tasks there).
  std::deque<Task> queue_;  // guarded by mutex_
  std::atomic<bool> stopping_{false};
  bool worker_sleeping_ = false;   // guarded by mutex_: enqueue wakes it only then
  std::atomic<size_t> queued_{0};  // queue_.size(), for the worker's spin and sleep
  std::thread worker_;             // started by the first enqueue, under mutex_
};

// The streams of one device, addressed by index; index 0 is the default stream.
class StreamSet {
 public:
  static constexpr int kMaxStreams = 1024;
  StreamSet();
  // NRT_INVALID_ARGUMENT once kMaxStreams streams exist; `label` names the device.
  nrt_status create(int priority, const char* label, int* out_index);
  std::shared_ptr<Stream> get(int index) const;  // nullptr if unknown
  std::vector<std::shared_ptr<Stream>> all() const;
  int size() const;

 private:
  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<Stream>> streams_;
};

}  // namespace nrt
