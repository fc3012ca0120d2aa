// Events (event.h): recorded at a position of a stream's work, completed with a timestamp when
// the stream reaches it; the nrt_event_* calls.
#include "event.h"

#include <string>
#include <unordered_set>

#include "error.h"
#include "runtime_state.h"

namespace {

std::mutex g_events_mutex;
std::unordered_set<nrt_event*> g_events;  // live handles, so a bad handle is detected

nrt_status lookup_event(nrt_event_t event, const char* call,
                        std::shared_ptr<nrt::EventState>* out) {
  std::lock_guard<std::mutex> lock(g_events_mutex);
  if (event == nullptr || g_events.count(event) == 0) {
    return nrt::fail(NRT_INVALID_HANDLE,
                     std::string(call) + ": unknown event (NULL, never created or destroyed)");
  }
  *out = event->state;
  return NRT_SUCCESS;
}

// Looks up a live event in a process allowed to use the runtime.
nrt_status usable_event(nrt_event_t event, const char* call,
                        std::shared_ptr<nrt::EventState>* out) {
  if (nrt_status status = nrt::check_not_forked()) return status;
  return lookup_event(event, call, out);
}

}  // namespace

extern "C" nrt_status nrt_event_create(unsigned flags, nrt_event_t* out_event) {
  if (out_event == nullptr)
    return nrt::fail(NRT_INVALID_ARGUMENT, "nrt_event_create: out_event is NULL");
  if ((flags & ~static_cast<unsigned>(NRT_EVENT_TIMING)) != 0) {
    return nrt::fail(NRT_INVALID_ARGUMENT, "nrt_event_create: unknown flags " +
                                               std::to_string(flags) +
                                               " (allowed: NRT_EVENT_DEFAULT, NRT_EVENT_TIMING)");
  }
  auto* event = new nrt_event{std::make_shared<nrt::EventState>(flags)};
  std::lock_guard<std::mutex> lock(g_events_mutex);
  g_events.insert(event);
  *out_event = event;
  return NRT_SUCCESS;
}

extern "C" nrt_status nrt_event_destroy(nrt_event_t event) {
  {
    std::lock_guard<std::mutex> lock(g_events_mutex);
    if (event == nullptr || g_events.erase(event) == 0) {
      return nrt::fail(NRT_INVALID_HANDLE,
                       "nrt_event_destroy: unknown event (NULL, never created or destroyed)");
    }
  }
  delete event;
  return NRT_SUCCESS;
}

extern "C" nrt_status nrt_event_record(nrt_event_t event, int device, int stream) {
  std::shared_ptr<nrt::EventState> state;
  if (nrt_status status = usable_event(event, "nrt_event_record", &state)) return status;
  std::shared_ptr<nrt::Stream> s;
  if (nrt_status status = nrt::lookup_stream(device, stream, &s)) return status;
  uint64_t generation = 0;
  uint64_t target = 0;
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    generation = ++state->generation;
    target = s->launched();
    state->recorded = true;
    state->done = false;
    state->stream = s;
    state->target = target;
  }
  s->when_reached(target, [state, generation] {
    const auto now = std::chrono::steady_clock::now();
    std::lock_guard<std::mutex> lock(state->mutex);
    if (state->generation != generation) return;  // re-recorded meanwhile
    state->time = now;
    state->done = true;
    state->done_cv.notify_all();
  });
  return NRT_SUCCESS;
}

extern "C" nrt_status nrt_event_query(nrt_event_t event) {
  std::shared_ptr<nrt::EventState> state;
  if (nrt_status status = usable_event(event, "nrt_event_query", &state)) return status;
  std::lock_guard<std::mutex> lock(state->mutex);
  return !state->recorded || state->done ? NRT_SUCCESS : NRT_NOT_READY;
}

extern "C" nrt_status nrt_event_synchronize(nrt_event_t event) {
  std::shared_ptr<nrt::EventState> state;
  if (nrt_status status = usable_event(event, "nrt_event_synchronize", &state)) return status;
  std::unique_lock<std::mutex> lock(state->mutex);
  if (!state->recorded || state->done) return NRT_SUCCESS;
  const std::shared_ptr<nrt::Stream> stream = state->stream.lock();
  if (stream != nullptr && stream->running_on_this_thread()) {
    return nrt::fail(NRT_INVALID_ARGUMENT,
                     "nrt_event_synchronize was called from a task of the stream the event "
                     "waits for; it would wait for itself forever");
  }
  state->done_cv.wait(lock, [&] { return state->done; });
  return NRT_SUCCESS;
}

extern "C" nrt_status nrt_stream_wait_event(int device, int stream, nrt_event_t event) {
  std::shared_ptr<nrt::EventState> state;
  if (nrt_status status = usable_event(event, "nrt_stream_wait_event", &state)) return status;
  std::shared_ptr<nrt::Stream> s;
  if (nrt_status status = nrt::lookup_stream(device, stream, &s)) return status;
  std::lock_guard<std::mutex> lock(state->mutex);
  if (state->recorded && !state->done) {
    if (std::shared_ptr<nrt::Stream> source = state->stream.lock()) {
      s->add_wait(std::move(source), state->target);
    }
  }
  return NRT_SUCCESS;
}

namespace {

nrt_status check_timing(const nrt::EventState& state, const char* which) {
  if ((state.flags & NRT_EVENT_TIMING) == 0) {
    return nrt::fail(NRT_INVALID_ARGUMENT, std::string("nrt_event_elapsed_ms: the ") + which +
                                               " event was created without NRT_EVENT_TIMING; "
                                               "create both events with NRT_EVENT_TIMING");
  }
  if (!state.recorded) {
    return nrt::fail(NRT_INVALID_ARGUMENT, std::string("nrt_event_elapsed_ms: the ") + which +
                                               " event was never recorded; record it on a "
                                               "stream first");
  }
  if (!state.done) {
    return nrt::fail(NRT_NOT_READY, std::string("nrt_event_elapsed_ms: the ") + which +
                                        " event has not completed yet; synchronize it first");
  }
  return NRT_SUCCESS;
}

}  // namespace

extern "C" nrt_status nrt_event_elapsed_ms(nrt_event_t start, nrt_event_t end, double* out_ms) {
  if (out_ms == nullptr)
    return nrt::fail(NRT_INVALID_ARGUMENT, "nrt_event_elapsed_ms: out_ms is NULL");
  std::shared_ptr<nrt::EventState> first;
  std::shared_ptr<nrt::EventState> last;
  if (nrt_status status = usable_event(start, "nrt_event_elapsed_ms", &first)) return status;
  if (nrt_status status = usable_event(end, "nrt_event_elapsed_ms", &last)) return status;
  std::chrono::steady_clock::time_point t0;
  std::chrono::steady_clock::time_point t1;
  {
    std::lock_guard<std::mutex> lock(first->mutex);
    if (nrt_status status = check_timing(*first, "start")) return status;
    t0 = first->time;
  }
  {
    std::lock_guard<std::mutex> lock(last->mutex);
    if (nrt_status status = check_timing(*last, "end")) return status;
    t1 = last->time;
  }
  *out_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  return NRT_SUCCESS;
}
