// Events mark a position in a stream's work; when the stream reaches it the event completes
// and (for every event) takes a steady_clock timestamp used by nrt_event_elapsed_ms.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>

#include "neuron_runtime.h"
#include "stream.h"

namespace nrt {

struct EventState {
  explicit EventState(unsigned event_flags) : flags(event_flags) {}
  const unsigned flags;
  std::mutex mutex;
  std::condition_variable done_cv;
  // All below guarded by mutex.
  uint64_t generation = 0;  // bumped by each record, so a stale completion is ignored
  bool recorded = false;
  bool done = false;
  // Weak: the completion callback holding this state runs on the stream's own worker, which
  // must never drop the last reference to its stream (its destructor joins the worker).
  std::weak_ptr<Stream> stream;
  uint64_t target = 0;  // the stream's launched count when recorded
  std::chrono::steady_clock::time_point time;
};

}  // namespace nrt

// The handle behind nrt_event_t.
struct nrt_event {
  std::shared_ptr<nrt::EventState> state;
};
