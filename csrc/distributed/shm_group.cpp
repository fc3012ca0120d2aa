// ShmGroup's set-up and synchronisation (shm_group.h): joining the segment, the barrier every
// collective starts with, and the checks that turn a dead, mismatched or late peer into an
// error. The collectives themselves are in shm_collectives.cpp.
#include "shm_group.h"

#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cpu_features.h"
#if defined(__linux__)
#include <linux/futex.h>
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace nrt::dist {
namespace {

constexpr uint64_t kMagic = 0x746e6e65636f6c6cULL;  // "tnnecoll"

struct Description {
  uint64_t sequence;  // the barrier this collective starts at
  uint32_t kind;
  uint32_t type;
  uint64_t count;
  uint32_t extra;  // reduce op or root
  uint32_t unused;
  char payload[ShmGroup::kPayloadChars + 1];  // what raw bytes are (a dtype name), or ""
};

struct alignas(64) RankState {
  std::atomic<uint64_t> arrived;
  std::atomic<uint32_t> wake;      // low bits of `arrived`: the futex word waiters sleep on
  std::atomic<uint32_t> sleepers;  // ranks asleep on `wake` (the arriver wakes them if any)
  std::atomic<int32_t> pid;
  Description description;
  std::atomic<uint64_t> pid_namespace;  // 0: unknown
};

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                  std::atomic<uint32_t>::is_always_lock_free &&
                  std::atomic<uint64_t>::is_always_lock_free,
              "the futex word and the counters must be plain lock-free words in shared memory");

void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// A process-shared futex (no FUTEX_PRIVATE_FLAG): the ranks map the word at different
// addresses. Elsewhere than Linux, a short sleep stands in.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
#if defined(__linux__)
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1000000000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1000000000);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
#else
  (void)word;
  (void)expected;
  std::this_thread::sleep_for(
      std::min<std::chrono::nanoseconds>(timeout, std::chrono::microseconds(50)));
#endif
}

void futex_wake_all(std::atomic<uint32_t>* word) {
#if defined(__linux__)
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
#else
  (void)word;
#endif
}

const char* const kCollectiveNames[] = {"barrier",        "all_reduce", "all_gather",
                                        "reduce_scatter", "broadcast",  "all_to_all"};

// A zombie (exited, not yet reaped by its parent) answers kill(pid, 0) like a live process.
bool process_running(int pid) {
  if (pid <= 0 || (kill(pid, 0) != 0 && errno != EPERM)) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // no procfs: trust kill()
  const auto paren = line.rfind(')');
  return paren == std::string::npos || paren + 2 >= line.size() ||
         (line[paren + 2] != 'Z' && line[paren + 2] != 'X');
}

// Pids are only comparable within one pid namespace (ranks in different containers may
// share /dev/shm): the namespace's inode number identifies it.
uint64_t pid_namespace_id() {
  struct stat info{};
  return stat("/proc/self/ns/pid", &info) == 0 ? static_cast<uint64_t>(info.st_ino) : 0;
}

size_t header_bytes() {
  return (sizeof(uint64_t) * 2 + sizeof(RankState) * kMaxRanks + 63) / 64 * 64 + 64;
}

}  // namespace

struct ShmGroup::Header {
  std::atomic<uint64_t> magic;
  uint64_t size;
  RankState ranks[kMaxRanks];
};

const char* collective_name(uint32_t kind) {
  return kind < sizeof(kCollectiveNames) / sizeof(kCollectiveNames[0]) ? kCollectiveNames[kind]
                                                                       : "unknown";
}

ShmGroup::ShmGroup(const GroupOptions& options)
    : rank_(options.rank),
      size_(options.size),
      slot_bytes_(options.slot_bytes),
      streaming_bytes_(options.streaming_bytes),
      timeout_(options.timeout) {
  if (size_ < 1 || size_ > kMaxRanks) {
    throw std::invalid_argument("shared-memory group size must be 1.." + std::to_string(kMaxRanks) +
                                ", got " + std::to_string(size_));
  }
  if (rank_ < 0 || rank_ >= size_) {
    throw std::invalid_argument("rank " + std::to_string(rank_) + " is outside a group of " +
                                std::to_string(size_));
  }
  // Two buffers, each with at least 8 bytes (one element) per rank.
  const size_t min_slot = std::max<size_t>(8 * kMaxRanks, 16 * static_cast<size_t>(size_));
  if (slot_bytes_ < min_slot || slot_bytes_ % 64 != 0) {
    throw std::invalid_argument("slot_bytes must be a multiple of 64, at least " +
                                std::to_string(min_slot) + ", got " + std::to_string(slot_bytes_));
  }
  const size_t total = header_bytes() + slot_bytes_ * static_cast<size_t>(size_);
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  if (rank_ == 0) {
    segment_ = SharedSegment::create(options.name, total);
    auto* h = static_cast<Header*>(segment_.data());
    h->size = static_cast<uint64_t>(size_);
    for (auto& r : h->ranks) {
      r.arrived.store(0, std::memory_order_relaxed);
      r.wake.store(0, std::memory_order_relaxed);
      r.sleepers.store(0, std::memory_order_relaxed);
      r.pid.store(0, std::memory_order_relaxed);
      r.pid_namespace.store(0, std::memory_order_relaxed);
    }
    h->magic.store(kMagic, std::memory_order_release);
  } else {
    segment_ = SharedSegment::open(options.name, total, deadline);
    auto* h = static_cast<Header*>(segment_.data());
    while (h->magic.load(std::memory_order_acquire) != kMagic) {
      if (std::chrono::steady_clock::now() >= deadline) {
        throw std::runtime_error("timed out waiting for rank 0 to set up " + options.name);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (h->size != static_cast<uint64_t>(size_)) {
      throw std::runtime_error("shared-memory group " + options.name + " was created for " +
                               std::to_string(h->size) + " ranks, this rank expects " +
                               std::to_string(size_));
    }
  }
  const uint64_t pid_namespace = pid_namespace_id();
  header()->ranks[rank_].pid_namespace.store(pid_namespace, std::memory_order_relaxed);
  header()->ranks[rank_].pid.store(static_cast<int32_t>(getpid()), std::memory_order_release);
  try {
    arrive_and_wait("group set-up");
  } catch (...) {
    segment_.unlink();  // no destructor runs for a throwing constructor: nothing left behind
    throw;
  }
  // Everyone is attached: drop the name, so nothing is left behind when processes exit.
  segment_.unlink();
  spin_budget_ =
      size_ > neuron::kernels::usable_cpus() ? std::chrono::microseconds(0) : kSpinBudget;
  for (int r = 0; r < size_; ++r) {
    peer_visible_[r] = pid_namespace != 0 && header()->ranks[r].pid_namespace.load(
                                                 std::memory_order_relaxed) == pid_namespace;
  }
}

ShmGroup::~ShmGroup() { segment_.unlink(); }

ShmGroup::Header* ShmGroup::header() const { return static_cast<Header*>(segment_.data()); }

char* ShmGroup::slot(int r) const {
  return static_cast<char*>(segment_.data()) + header_bytes() +
         slot_bytes_ * static_cast<size_t>(r);
}

// Waiting for a peer: spin briefly, then yield (the peer, or whatever else needs the CPU,
// runs; on an idle core yield returns at once, so this still polls every microsecond or so),
// then sleep on its futex word until it arrives, waking every kLivenessPeriod to check it is
// alive and the deadline.
// With more ranks than usable CPUs a peer that has not arrived is probably waiting for this
// rank's CPU, so the spin is skipped.
void ShmGroup::arrive_and_wait(const char* what) {
  const uint64_t target = ++sequence_;
  Header* h = header();
  RankState& me = h->ranks[rank_];
  me.arrived.store(target, std::memory_order_release);
  me.wake.store(static_cast<uint32_t>(target), std::memory_order_seq_cst);
  if (me.sleepers.load(std::memory_order_seq_cst) != 0) futex_wake_all(&me.wake);
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + timeout();
  auto next_check = start + kLivenessPeriod;
  for (int r = 0; r < size_; ++r) {
    RankState& peer = h->ranks[r];
    if (peer.arrived.load(std::memory_order_acquire) >= target) continue;
    while (std::chrono::steady_clock::now() - start < spin_budget_) {
      for (int i = 0; i < 64; ++i) cpu_relax();
      if (peer.arrived.load(std::memory_order_acquire) >= target) break;
    }
    while (std::chrono::steady_clock::now() - start < spin_budget_ + kYieldBudget &&
           peer.arrived.load(std::memory_order_acquire) < target) {
      std::this_thread::yield();
    }
    while (peer.arrived.load(std::memory_order_acquire) < target) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= next_check) {
        check_liveness(what, target, start);
        next_check = now + kLivenessPeriod;
      }
      if (now >= deadline) fail_timeout(what, target);
      // Registered before the last look at `arrived`: an arrival after it changes `wake`
      // (the futex then returns at once) or sees this sleeper and wakes it.
      peer.sleepers.fetch_add(1, std::memory_order_seq_cst);
      const uint32_t seen = peer.wake.load(std::memory_order_seq_cst);
      if (peer.arrived.load(std::memory_order_seq_cst) < target) {
        futex_wait(&peer.wake, seen, std::min(next_check, deadline) - now);
      }
      peer.sleepers.fetch_sub(1, std::memory_order_seq_cst);
    }
  }
}

void ShmGroup::check_liveness(const char* what, uint64_t target,
                              std::chrono::steady_clock::time_point since) {
  for (int r = 0; r < size_; ++r) {
    if (!peer_visible_[r] || header()->ranks[r].arrived.load(std::memory_order_acquire) >= target) {
      continue;
    }
    const int pid = header()->ranks[r].pid.load(std::memory_order_acquire);
    if (!process_running(pid)) fail_exited(what, r, pid, since);
  }
}

void ShmGroup::fail_exited(const char* what, int peer, int pid,
                           std::chrono::steady_clock::time_point since) {
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - since);
  throw std::runtime_error(std::string("neuron collective ") + what + " on rank " +
                           std::to_string(rank_) + ": rank " + std::to_string(peer) + " (pid " +
                           std::to_string(pid) + ") exited before joining it (noticed after " +
                           std::to_string(waited.count()) +
                           " ms of waiting); the group cannot continue: end this process and "
                           "restart the job (torchrun restarts all ranks with --max-restarts)");
}

void ShmGroup::fail_timeout(const char* what, uint64_t target) {
  std::string missing;
  for (int r = 0; r < size_; ++r) {
    if (header()->ranks[r].arrived.load(std::memory_order_acquire) >= target) continue;
    const int pid = header()->ranks[r].pid.load(std::memory_order_acquire);
    const bool alive = process_running(pid);
    if (!missing.empty()) missing += ", ";
    missing +=
        "rank " + std::to_string(r) +
        (pid <= 0 ? " (never attached)"
                  : " (pid " + std::to_string(pid) +
                        (alive ? ", running: stalled or in another collective)" : ", exited)"));
  }
  throw std::runtime_error(std::string("neuron collective ") + what + " timed out after " +
                           std::to_string(timeout().count()) + " ms on rank " +
                           std::to_string(rank_) + ": waiting for " + missing);
}

uint32_t ShmGroup::reduction_extra(ReduceOp op, Finish finish) {
  return static_cast<uint32_t>(op) | (static_cast<uint32_t>(finish) << 16);
}

void ShmGroup::begin(Kind kind, uint64_t count, ElementType type, uint32_t extra,
                     const char* payload) {
  Description& mine = header()->ranks[rank_].description;
  mine = Description{
      sequence_ + 1, static_cast<uint32_t>(kind), static_cast<uint32_t>(type), count, extra, 0, {}};
  std::strncpy(mine.payload, payload, kPayloadChars);
  arrive_and_wait(collective_name(static_cast<uint32_t>(kind)));
  for (int r = 0; r < size_; ++r) {
    const Description& other = header()->ranks[r].description;
    if (other.sequence != mine.sequence || other.kind != mine.kind || other.type != mine.type ||
        other.count != mine.count || other.extra != mine.extra ||
        std::strncmp(other.payload, mine.payload, kPayloadChars) != 0) {
      fail_mismatch(r);
    }
  }
}

void ShmGroup::fail_mismatch(int other) {
  const Description& a = header()->ranks[rank_].description;
  const Description& b = header()->ranks[other].description;
  auto describe = [](const Description& d) {
    const auto kind = static_cast<Kind>(d.kind);
    std::string extra;
    if (kind == Kind::kAllReduce || kind == Kind::kReduceScatter) {
      static const char* const finishes[] = {"", " then averaged", " of pre-multiplied values"};
      const uint32_t finish = d.extra >> 16;
      extra = std::string(", op ") + reduce_op_name(static_cast<ReduceOp>(d.extra & 0xffff)) +
              (finish < 3 ? finishes[finish] : "");
    } else if (kind == Kind::kBroadcast) {
      extra = ", root " + std::to_string(d.extra);
    }
    const std::string what =
        d.payload[0] != '\0'
            ? std::string(" bytes of ") + d.payload
            : std::string(" x ") + element_type_name(static_cast<ElementType>(d.type));
    return std::string(collective_name(d.kind)) + "(" + std::to_string(d.count) + what + extra +
           ", call #" + std::to_string(d.sequence) + ")";
  };
  const std::string message = "neuron collectives do not match across ranks: rank " +
                              std::to_string(rank_) + " called " + describe(a) + ", rank " +
                              std::to_string(other) + " called " + describe(b) +
                              ". Every rank must issue the same collectives, in the same "
                              "order, with the same sizes and dtypes.";
  // Every rank sees a mismatch when any two differ. One more arrival keeps each rank's
  // description in place until all have read it: a rank that threw first could otherwise
  // publish its next call's description under a peer still composing this message.
  arrive_and_wait(collective_name(a.kind));
  throw std::runtime_error(message);
}

void ShmGroup::barrier() {
  begin(Kind::kBarrier, 0, ElementType::kUInt8, 0);
  // A second arrival: no rank may publish its next description while another still checks.
  arrive_and_wait("barrier");
}

size_t ShmGroup::buffer_bytes() const { return slot_bytes_ / 2 / 64 * 64; }

char* ShmGroup::buffer(int r, uint64_t round) const {
  return slot(r) + (round & 1) * buffer_bytes();
}

}  // namespace nrt::dist
