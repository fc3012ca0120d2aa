// A group of processes on one host exchanging data through one shared-memory segment.
//
// Layout: a header with one cache-line slot per rank (arrival counter, pid, the
// description of the collective it is in), then one data slot per rank. Synchronisation is
// by per-rank sequence numbers: a rank arrives at barrier n by publishing n and waits until
// every rank has published n or more, so no shared counter needs resetting. A waiting rank
// polls the liveness of the ranks it waits for, so one that exited is reported within
// kLivenessPeriod; one that does not arrive within the timeout is named as stalled; and ranks
// that enter different collectives, or the same one with other sizes or types, get an
// error instead of mixing their data.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "element_ops.h"
#include "shm_segment.h"

namespace nrt::dist {

constexpr int kMaxRanks = 64;
// How often a waiting rank checks that the ranks it waits for are still running.
constexpr std::chrono::milliseconds kLivenessPeriod{100};
constexpr size_t kDefaultSlotBytes = 1 << 20;
constexpr size_t kDefaultStreamingBytes = 8 << 20;

struct GroupOptions {
  std::string name;  // unique per group and host, e.g. "/torchneuron-<id>"
  int rank = 0;
  int size = 1;
  // Per-rank staging, as two buffers used in turn; larger messages go in rounds of half
  // of it. Small enough that every rank's buffers stay in cache (see the .cpp).
  size_t slot_bytes = kDefaultSlotBytes;
  // Outputs of at least this many bytes are written with cache-bypassing stores.
  size_t streaming_bytes = kDefaultStreamingBytes;
  std::chrono::milliseconds timeout{300000};
};

class ShmGroup {
 public:
  // Rank 0 creates the segment, the others open it; returns once all ranks are attached.
  // The name is removed right after, so the memory goes away with the last process.
  explicit ShmGroup(const GroupOptions& options);
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;
  ~ShmGroup();

  int rank() const { return rank_; }
  int size() const { return size_; }

  // Timeout of the collectives that follow; a negative value restores the group's.
  void set_call_timeout(std::chrono::milliseconds timeout) { call_timeout_ = timeout; }
  std::chrono::milliseconds call_timeout() const { return call_timeout_; }
  std::chrono::milliseconds timeout() const {
    return call_timeout_.count() >= 0 ? call_timeout_ : timeout_;
  }

  void barrier();
  // What the caller does around a reduction (a sum then a division is an average); ranks
  // must agree on it as on the op, or AVG on one rank and SUM on another pass unnoticed.
  enum class Finish : uint32_t { kNone, kAverage, kPremultiplied };
  // In place over `count` elements of every rank's buffer.
  void all_reduce(void* data, size_t count, ElementType type, ReduceOp op,
                  Finish finish = Finish::kNone);
  // out holds size() * bytes: rank r's `in` lands at out + r * bytes. `payload` names what
  // the bytes are (the caller's dtype, at most kPayloadChars): ranks must agree on it, or
  // float32 bytes would be read as int32 unnoticed.
  void all_gather(const void* in, void* out, size_t bytes, const char* payload = "");
  // in holds size() * count elements; rank r receives the reduction of block r.
  void reduce_scatter(const void* in, void* out, size_t count, ElementType type, ReduceOp op,
                      Finish finish = Finish::kNone);
  void broadcast(void* data, size_t bytes, int root, const char* payload = "");
  static constexpr size_t kPayloadChars = 23;
  // Uneven all-to-all: send_bytes[d] bytes of `in` (blocks in destination order) go to rank
  // d; recv_bytes[s] bytes from rank s land in `out` (blocks in source order). Every rank's
  // send sizes must equal its peers' receive sizes; a mismatch raises on every rank.
  void all_to_all(const void* in, const size_t* send_bytes, void* out, const size_t* recv_bytes);

 private:
  struct Header;
  enum class Kind : uint32_t {
    kBarrier,
    kAllReduce,
    kAllGather,
    kReduceScatter,
    kBroadcast,
    kAllToAll
  };

  Header* header() const;
  char* slot(int r) const;
  // Rank r's staging buffer for round `round` of a collective (two, used in turn).
  size_t buffer_bytes() const;
  char* buffer(int r, uint64_t round) const;
  // dst = sources[0] op sources[1] op ... (size() of them, in rank order).
  void reduce_sources(char* dst, const char* const* sources, size_t count, ElementType type,
                      ReduceOp op);
  // dst = a + b (and the same into `cached` when set) in one pass with streaming stores
  // (streaming_sum.h), for a SUM of two ranks in float32, or bfloat16 on AVX2 hosts; false,
  // having done nothing, otherwise.
  bool sum_streaming(char* dst, const char* a, const char* b, size_t count, ElementType type,
                     ReduceOp op, char* cached = nullptr) const;
  static constexpr size_t kReduceTileBytes = 16 << 10;
  static constexpr size_t kSmallAllReduceBytes = 64 << 10;
  // Publishes this rank's description of the collective and checks every rank's after
  // the first barrier: same kind, element type, count, op and root.
  void begin(Kind kind, uint64_t count, ElementType type, uint32_t extra, const char* payload = "");
  static uint32_t reduction_extra(ReduceOp op, Finish finish);
  void arrive_and_wait(const char* what);
  [[noreturn]] void fail_timeout(const char* what, uint64_t target);
  [[noreturn]] void fail_exited(const char* what, int peer, int pid,
                                std::chrono::steady_clock::time_point since);
  // Throws if a rank that has not reached `target` exited (only ranks in this process's
  // pid namespace: another namespace's pid would look like an exit).
  void check_liveness(const char* what, uint64_t target,
                      std::chrono::steady_clock::time_point since);
  [[noreturn]] void fail_mismatch(int other);

  int rank_;
  int size_;
  size_t slot_bytes_;
  size_t streaming_bytes_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds call_timeout_{-1};
  uint64_t sequence_ = 0;
  bool peer_visible_[kMaxRanks] = {};
  // How long a waiting rank spins before it yields, then sleeps (see arrive_and_wait).
  // Short: in a virtual machine a longer PAUSE loop makes the hypervisor deschedule the
  // vCPU (pause-loop exiting); a 100 us spin cost ~200 us per barrier on this KVM host.
  static constexpr std::chrono::microseconds kSpinBudget{5};
  static constexpr std::chrono::microseconds kYieldBudget{400};
  std::chrono::microseconds spin_budget_ = kSpinBudget;  // barriers passed by this rank
  SharedSegment segment_;
};

const char* collective_name(uint32_t kind);

}  // namespace nrt::dist
