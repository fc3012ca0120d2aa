// Tests of streams and events: launch order, asynchronous and blocking launches, waits,
// queries and the errors of misuse.
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "runtime_test_support.h"

namespace {

using StreamEventTest = RuntimeTest;

struct Recorder {
  std::vector<int>* order;
  int value;
};

void append(void* arg) {
  auto* r = static_cast<Recorder*>(arg);
  r->order->push_back(r->value);
}

void sleep_20ms(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(20)); }

// Runs `fn` as a task: lets a test observe the runtime from inside running work.
template <typename F>
nrt_status launch_lambda(int device, int stream, F& fn) {
  return nrt_stream_launch(device, stream, [](void* arg) { (*static_cast<F*>(arg))(); }, &fn);
}

TEST_F(StreamEventTest, DefaultStreamExistsAndNewStreamsGetNewIndices) {
  EXPECT_NRT_OK(nrt_stream_query(0, 0));
  int a = -1, b = -1, c = -1;
  ASSERT_NRT_OK(nrt_stream_create(0, 0, &a));
  ASSERT_NRT_OK(nrt_stream_create(0, -1, &b));
  ASSERT_NRT_OK(nrt_stream_create(1, 0, &c));
  EXPECT_EQ(a, 1);
  EXPECT_EQ(b, 2);
  EXPECT_EQ(c, 1);  // per device
  EXPECT_NRT_OK(nrt_stream_query(0, 2));
  EXPECT_EQ(nrt_stream_query(1, 2), NRT_INVALID_HANDLE);
  EXPECT_CONTAINS(last_error(), "neuron:1 has no stream 2");
}

TEST_F(StreamEventTest, TasksRunInLaunchOrderPerStream) {
  int s = 0;
  ASSERT_NRT_OK(nrt_stream_create(0, 0, &s));
  std::vector<int> order[2];
  std::vector<Recorder> recorders;
  for (int i = 0; i < 100; ++i) recorders.push_back({&order[i % 2], i});
  for (int i = 0; i < 100; ++i) {
    ASSERT_NRT_OK(nrt_stream_launch(0, i % 2 ? s : 0, append, &recorders[i]));
  }
  ASSERT_NRT_OK(nrt_device_synchronize(0));
  for (int parity = 0; parity < 2; ++parity) {
    ASSERT_EQ(order[parity].size(), 50u);
    for (int j = 0; j < 50; ++j) EXPECT_EQ(order[parity][j], 2 * j + parity);
  }
  EXPECT_NRT_OK(nrt_stream_query(0, s));
}

TEST_F(StreamEventTest, LaunchReturnsBeforeTheWorkRunsUnlessBlocking) {
  ASSERT_EQ(nrt_launch_blocking(), 0);  // the default mode
  int s = 0;
  ASSERT_NRT_OK(nrt_stream_create(0, 0, &s));
  std::atomic<bool> release{false}, ran{false};
  auto task = [&] {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ran = true;
  };
  ASSERT_NRT_OK(launch_lambda(0, s, task));  // would never return if it ran inline
  EXPECT_FALSE(ran);
  EXPECT_EQ(nrt_stream_query(0, s), NRT_NOT_READY);
  release = true;
  ASSERT_NRT_OK(nrt_stream_synchronize(0, s));
  EXPECT_TRUE(ran);

  setenv("NEURON_LAUNCH_BLOCKING", "1", 1);
  int blocking = 0;
  ASSERT_NRT_OK(nrt_stream_create(0, 0, &blocking));  // the mode is read at creation
  unsetenv("NEURON_LAUNCH_BLOCKING");
  bool inline_ran = false;
  auto mark = [&] { inline_ran = true; };
  ASSERT_NRT_OK(launch_lambda(0, blocking, mark));
  EXPECT_TRUE(inline_ran);
}

TEST_F(StreamEventTest, WaitEventAloneIsCoveredBySynchronize) {
  int producer = 0, consumer = 0;
  ASSERT_NRT_OK(nrt_stream_create(0, 0, &producer));
  ASSERT_NRT_OK(nrt_stream_create(0, 0, &consumer));
  std::atomic<bool> release{false}, done{false};
  auto produce = [&] {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    done = true;
  };
  ASSERT_NRT_OK(launch_lambda(0, producer, produce));
  nrt_event_t e = nullptr;
  ASSERT_NRT_OK(nrt_event_create(NRT_EVENT_DEFAULT, &e));
  ASSERT_NRT_OK(nrt_event_record(e, 0, producer));
  ASSERT_NRT_OK(nrt_stream_wait_event(0, consumer, e));
  EXPECT_EQ(nrt_stream_query(0, consumer), NRT_NOT_READY);  // waiting is pending work
  release = true;
  ASSERT_NRT_OK(nrt_stream_synchronize(0, consumer));
  EXPECT_TRUE(done);
  EXPECT_NRT_OK(nrt_event_destroy(e));
}

TEST_F(StreamEventTest, QueryIsNotReadyWhileWorkRuns) {
  nrt_status inside = NRT_SUCCESS;
  auto task = [&] { inside = nrt_stream_query(0, 0); };
  ASSERT_NRT_OK(launch_lambda(0, 0, task));
  ASSERT_NRT_OK(nrt_stream_synchronize(0, 0));
  EXPECT_EQ(inside, NRT_NOT_READY);
  EXPECT_NRT_OK(nrt_stream_query(0, 0));
}

TEST_F(StreamEventTest, SynchronizingOwnStreamFromATaskIsRefused) {
  int s = 0;
  ASSERT_NRT_OK(nrt_stream_create(0, 0, &s));
  nrt_status own = NRT_SUCCESS, device = NRT_SUCCESS, other = NRT_INVALID_ARGUMENT;
  auto task = [&] {
    own = nrt_stream_synchronize(0, s);
    device = nrt_device_synchronize(0);
    other = nrt_stream_synchronize(0, 0);
  };
  ASSERT_NRT_OK(launch_lambda(0, s, task));
  ASSERT_NRT_OK(nrt_stream_synchronize(0, s));
  EXPECT_EQ(own, NRT_INVALID_ARGUMENT);
  EXPECT_EQ(device, NRT_INVALID_ARGUMENT);
  EXPECT_EQ(other, NRT_SUCCESS);
}

TEST_F(StreamEventTest, InvalidArguments) {
  EXPECT_EQ(nrt_stream_launch(0, 0, nullptr, nullptr), NRT_INVALID_ARGUMENT);
  EXPECT_EQ(nrt_stream_launch(0, 5, sleep_20ms, nullptr), NRT_INVALID_HANDLE);
  EXPECT_EQ(nrt_stream_launch(0, -1, sleep_20ms, nullptr), NRT_INVALID_HANDLE);
  EXPECT_EQ(nrt_stream_launch(9, 0, sleep_20ms, nullptr), NRT_INVALID_DEVICE);
  EXPECT_EQ(nrt_stream_synchronize(0, 3), NRT_INVALID_HANDLE);
  EXPECT_EQ(nrt_device_synchronize(-1), NRT_INVALID_DEVICE);
  EXPECT_EQ(nrt_stream_create(0, 0, nullptr), NRT_INVALID_ARGUMENT);
  int s = 0;
  EXPECT_EQ(nrt_stream_create(4, 0, &s), NRT_INVALID_DEVICE);
}

TEST_F(StreamEventTest, StreamLimitPerDevice) {
  int s = 0;
  int created = 0;
  while (nrt_stream_create(0, 0, &s) == NRT_SUCCESS && created < 5000) ++created;
  EXPECT_EQ(created, 1023);  // plus the default stream: 1024
  EXPECT_CONTAINS(last_error(), "1024");
  EXPECT_EQ(nrt_stream_create(0, 0, &s), NRT_INVALID_ARGUMENT);
  EXPECT_NRT_OK(nrt_stream_create(1, 0, &s));
}

TEST_F(StreamEventTest, LaunchBlockingFollowsTheEnvironment) {
  EXPECT_EQ(nrt_launch_blocking(), 0);
  setenv("NEURON_LAUNCH_BLOCKING", "1", 1);
  EXPECT_EQ(nrt_launch_blocking(), 1);
  setenv("NEURON_LAUNCH_BLOCKING", "0", 1);
  EXPECT_EQ(nrt_launch_blocking(), 0);
}

TEST_F(StreamEventTest, EventLifecycle) {
  nrt_event_t e = nullptr;
  EXPECT_EQ(nrt_event_create(4, &e), NRT_INVALID_ARGUMENT);
  EXPECT_EQ(nrt_event_create(0, nullptr), NRT_INVALID_ARGUMENT);
  ASSERT_NRT_OK(nrt_event_create(NRT_EVENT_DEFAULT, &e));
  EXPECT_NRT_OK(nrt_event_query(e));  // never recorded
  EXPECT_NRT_OK(nrt_event_synchronize(e));
  EXPECT_NRT_OK(nrt_stream_wait_event(0, 0, e));
  EXPECT_EQ(nrt_event_record(e, 0, 7), NRT_INVALID_HANDLE);
  EXPECT_EQ(nrt_event_record(e, 4, 0), NRT_INVALID_DEVICE);
  ASSERT_NRT_OK(nrt_event_record(e, 0, 0));
  EXPECT_NRT_OK(nrt_event_query(e));
  ASSERT_NRT_OK(nrt_event_record(e, 1, 0));  // re-recording is allowed
  EXPECT_NRT_OK(nrt_event_synchronize(e));
  EXPECT_NRT_OK(nrt_event_destroy(e));
  EXPECT_EQ(nrt_event_destroy(e), NRT_INVALID_HANDLE);
  EXPECT_EQ(nrt_event_query(e), NRT_INVALID_HANDLE);
  EXPECT_EQ(nrt_event_destroy(nullptr), NRT_INVALID_HANDLE);
}

TEST_F(StreamEventTest, ElapsedTimeCoversWorkBetweenRecords) {
  nrt_event_t start = nullptr, end = nullptr;
  ASSERT_NRT_OK(nrt_event_create(NRT_EVENT_TIMING, &start));
  ASSERT_NRT_OK(nrt_event_create(NRT_EVENT_TIMING, &end));
  ASSERT_NRT_OK(nrt_event_record(start, 0, 0));
  ASSERT_NRT_OK(nrt_stream_launch(0, 0, sleep_20ms, nullptr));
  ASSERT_NRT_OK(nrt_event_record(end, 0, 0));
  ASSERT_NRT_OK(nrt_event_synchronize(end));
  double ms = -1;
  ASSERT_NRT_OK(nrt_event_elapsed_ms(start, end, &ms));
  EXPECT_GE(ms, 19.9);
  EXPECT_LT(ms, 2000.0);  // generous: the machine is shared
  double back = 0;
  ASSERT_NRT_OK(nrt_event_elapsed_ms(end, start, &back));
  EXPECT_DOUBLE_EQ(back, -ms);
  EXPECT_EQ(nrt_event_elapsed_ms(start, end, nullptr), NRT_INVALID_ARGUMENT);
  nrt_event_destroy(start);
  nrt_event_destroy(end);
}

TEST_F(StreamEventTest, ElapsedTimeErrors) {
  nrt_event_t plain = nullptr, timing = nullptr, unrecorded = nullptr;
  ASSERT_NRT_OK(nrt_event_create(NRT_EVENT_DEFAULT, &plain));
  ASSERT_NRT_OK(nrt_event_create(NRT_EVENT_TIMING, &timing));
  ASSERT_NRT_OK(nrt_event_create(NRT_EVENT_TIMING, &unrecorded));
  ASSERT_NRT_OK(nrt_event_record(plain, 0, 0));
  ASSERT_NRT_OK(nrt_event_record(timing, 0, 0));
  double ms = 0;
  EXPECT_EQ(nrt_event_elapsed_ms(plain, timing, &ms), NRT_INVALID_ARGUMENT);
  EXPECT_CONTAINS(last_error(), "start event was created without NRT_EVENT_TIMING");
  EXPECT_EQ(nrt_event_elapsed_ms(timing, plain, &ms), NRT_INVALID_ARGUMENT);
  EXPECT_CONTAINS(last_error(), "end event was created without NRT_EVENT_TIMING");
  EXPECT_EQ(nrt_event_elapsed_ms(timing, unrecorded, &ms), NRT_INVALID_ARGUMENT);
  EXPECT_CONTAINS(last_error(), "never recorded");

  // Recorded inside a running task: the event waits for that task, so it is not ready yet.
  nrt_status query = NRT_SUCCESS, elapsed = NRT_SUCCESS;
  auto task = [&] {
    nrt_event_record(unrecorded, 0, 0);
    query = nrt_event_query(unrecorded);
    elapsed = nrt_event_elapsed_ms(timing, unrecorded, &ms);
  };
  ASSERT_NRT_OK(launch_lambda(0, 0, task));
  ASSERT_NRT_OK(nrt_stream_synchronize(0, 0));
  EXPECT_EQ(query, NRT_NOT_READY);
  EXPECT_EQ(elapsed, NRT_NOT_READY);
  EXPECT_NRT_OK(nrt_event_query(unrecorded));
  EXPECT_NRT_OK(nrt_event_elapsed_ms(timing, unrecorded, &ms));
  for (nrt_event_t e : {plain, timing, unrecorded}) nrt_event_destroy(e);
}

TEST_F(StreamEventTest, WaitEventOrdersWorkAcrossStreamsAndThreads) {
  int producer = 0, consumer = 0;
  ASSERT_NRT_OK(nrt_stream_create(0, 0, &producer));
  ASSERT_NRT_OK(nrt_stream_create(1, 0, &consumer));
  std::atomic<bool> release{false}, producer_started{false}, producer_done{false};
  std::atomic<bool> consumer_ran{false}, consumer_saw_producer_done{false};

  auto produce = [&] {
    producer_started = true;
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    producer_done = true;
  };
  std::thread producer_thread([&] { launch_lambda(0, producer, produce); });
  while (!producer_started) std::this_thread::sleep_for(std::chrono::milliseconds(1));

  nrt_event_t e = nullptr;
  ASSERT_NRT_OK(nrt_event_create(NRT_EVENT_DEFAULT, &e));
  ASSERT_NRT_OK(nrt_event_record(e, 0, producer));  // covers the running task
  EXPECT_EQ(nrt_event_query(e), NRT_NOT_READY);
  EXPECT_EQ(nrt_stream_query(0, producer), NRT_NOT_READY);
  ASSERT_NRT_OK(nrt_stream_wait_event(1, consumer, e));

  auto consume = [&] {
    consumer_saw_producer_done = producer_done.load();
    consumer_ran = true;
  };
  std::thread consumer_thread([&] { launch_lambda(1, consumer, consume); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(consumer_ran);  // held back by the event
  release = true;
  ASSERT_NRT_OK(nrt_event_synchronize(e));
  EXPECT_TRUE(producer_done);
  producer_thread.join();
  consumer_thread.join();
  ASSERT_NRT_OK(nrt_stream_synchronize(1, consumer));
  EXPECT_TRUE(consumer_ran);
  EXPECT_TRUE(consumer_saw_producer_done);
  EXPECT_NRT_OK(nrt_stream_query(0, producer));
  EXPECT_NRT_OK(nrt_event_destroy(e));
}

}  // namespace
