// Shared-memory collectives between forked processes: results against closed forms,
// chunking, 16-bit floats, a dead rank and mismatched calls.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <functional>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "shm_group.h"

using nrt::dist::ElementType;
using nrt::dist::GroupOptions;
using nrt::dist::ReduceOp;
using nrt::dist::ShmGroup;

namespace {

std::string unique_name(const char* test) {
  return "/tn-test-" + std::string(test) + "-" + std::to_string(getpid());
}

// Runs body(rank) in `size` forked processes; returns each child's exit status.
std::vector<int> run_ranks(int size, const std::function<int(int)>& body) {
  std::vector<pid_t> pids;
  for (int r = 0; r < size; ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      int code = 99;
      try {
        code = body(r);
      } catch (const std::exception& e) {
        fprintf(stderr, "rank %d: %s\n", r, e.what());
        code = 98;
      }
      _exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 100);
  }
  return codes;
}

GroupOptions options(const std::string& name, int rank, int size, size_t slot = 4096) {
  GroupOptions o;
  o.name = name;
  o.rank = rank;
  o.size = size;
  o.slot_bytes = slot;
  o.timeout = std::chrono::milliseconds(20000);
  return o;
}

uint16_t to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>(bits >> 16);  // exact for the small integers used here
}

float from_bf16(uint16_t v) {
  const uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

TEST(ShmGroup, AllReduceSumMaxAcrossChunks) {
  const std::string name = unique_name("allreduce");
  for (int size : {2, 3, 4}) {
    const auto codes = run_ranks(size, [&](int rank) {
      ShmGroup group(options(name + std::to_string(size), rank, size));
      const size_t n = 3000;  // 12 KB of float32: three chunks of a 4 KiB slot
      std::vector<float> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(rank + 1) * static_cast<float>(i);
      group.all_reduce(v.data(), n, ElementType::kFloat32, ReduceOp::kSum);
      const float total = static_cast<float>(size * (size + 1) / 2);
      for (size_t i = 0; i < n; ++i) {
        if (v[i] != total * static_cast<float>(i)) return 1;
      }
      std::vector<int64_t> m(5, rank);
      group.all_reduce(m.data(), m.size(), ElementType::kInt64, ReduceOp::kMax);
      for (int64_t x : m) {
        if (x != size - 1) return 2;
      }
      std::vector<uint16_t> h(7, to_bf16(static_cast<float>(rank + 1)));
      group.all_reduce(h.data(), h.size(), ElementType::kBFloat16, ReduceOp::kSum);
      for (uint16_t x : h) {
        if (from_bf16(x) != total) return 3;
      }
      return 0;
    });
    EXPECT_EQ(codes, std::vector<int>(size, 0)) << "size " << size;
  }
}

TEST(ShmGroup, AllGatherReduceScatterBroadcastBarrier) {
  const std::string name = unique_name("gather");
  const int size = 3;
  const auto codes = run_ranks(size, [&](int rank) {
    ShmGroup group(options(name, rank, size, 512));
    const size_t n = 1000;  // more than one 512-byte slot per rank
    std::vector<int32_t> mine(n, rank * 10), all(n * size, -1);
    group.all_gather(mine.data(), all.data(), n * sizeof(int32_t));
    for (int r = 0; r < size; ++r) {
      for (size_t i = 0; i < n; ++i) {
        if (all[r * n + i] != r * 10) return 1;
      }
    }
    std::vector<float> in(n * size), out(n, -1);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i);
    group.reduce_scatter(in.data(), out.data(), n, ElementType::kFloat32, ReduceOp::kSum);
    for (size_t i = 0; i < n; ++i) {
      if (out[i] != size * static_cast<float>(rank * n + i)) return 2;
    }
    std::vector<double> b(300, rank == 1 ? 2.5 : 0.0);
    group.broadcast(b.data(), b.size() * sizeof(double), 1);
    for (double x : b) {
      if (x != 2.5) return 3;
    }
    for (int i = 0; i < 50; ++i) group.barrier();
    return 0;
  });
  EXPECT_EQ(codes, std::vector<int>(size, 0));
}

// A rank that exits is reported within about a second, long before the group timeout.
TEST(ShmGroup, DeadRankIsReportedWithinASecond) {
  const std::string name = unique_name("dead");
  const auto codes = run_ranks(2, [&](int rank) {
    GroupOptions o = options(name, rank, 2);
    o.timeout = std::chrono::milliseconds(60000);
    ShmGroup group(o);
    if (rank == 1) _exit(0);  // dies without joining the collective
    float x = 1;
    const auto start = std::chrono::steady_clock::now();
    try {
      group.all_reduce(&x, 1, ElementType::kFloat32, ReduceOp::kSum);
    } catch (const std::runtime_error& e) {
      const auto waited = std::chrono::steady_clock::now() - start;
      const std::string what = e.what();
      const bool named = what.find("all_reduce") != std::string::npos &&
                         what.find("rank 1") != std::string::npos &&
                         what.find("exited") != std::string::npos;
      if (!named) fprintf(stderr, "message: %s\n", what.c_str());
      return !named ? 5 : waited < std::chrono::seconds(1) ? 0 : 7;
    }
    return 6;
  });
  EXPECT_EQ(codes, std::vector<int>({0, 0}));
}

// A live rank that does not arrive is named as stalled when the call's own timeout
// expires; the group's timeout applies again afterwards.
TEST(ShmGroup, CallTimeoutOverridesTheGroupTimeout) {
  const std::string name = unique_name("calltimeout");
  const auto codes = run_ranks(2, [&](int rank) {
    GroupOptions o = options(name, rank, 2);
    o.timeout = std::chrono::milliseconds(60000);
    ShmGroup group(o);
    if (rank == 1) {
      usleep(1500 * 1000);  // stalls past rank 0's call timeout, then exits
      return 0;
    }
    group.set_call_timeout(std::chrono::milliseconds(300));
    const auto start = std::chrono::steady_clock::now();
    try {
      group.barrier();
    } catch (const std::runtime_error& e) {
      const auto waited = std::chrono::steady_clock::now() - start;
      const std::string what = e.what();
      const bool named = what.find("timed out after 300 ms") != std::string::npos &&
                         what.find("rank 1") != std::string::npos &&
                         what.find("stalled") != std::string::npos;
      if (!named) fprintf(stderr, "message: %s\n", what.c_str());
      group.set_call_timeout(std::chrono::milliseconds(-1));
      const bool restored = group.timeout() == std::chrono::milliseconds(60000);
      return !named ? 5 : !restored ? 8 : waited < std::chrono::milliseconds(1200) ? 0 : 7;
    }
    return 6;
  });
  EXPECT_EQ(codes, std::vector<int>({0, 0}));
}

TEST(ShmGroup, MismatchedCallsFailOnEveryRank) {
  const std::string name = unique_name("mismatch");
  const auto codes = run_ranks(2, [&](int rank) {
    ShmGroup group(options(name, rank, 2));
    std::vector<float> v(8 + rank, 1.0f);
    try {
      group.all_reduce(v.data(), v.size(), ElementType::kFloat32, ReduceOp::kSum);
    } catch (const std::runtime_error& e) {
      return std::string(e.what()).find("do not match") != std::string::npos ? 0 : 7;
    }
    return 8;
  });
  EXPECT_EQ(codes, std::vector<int>({0, 0}));
}

// Raw-byte collectives carry the caller's dtype: float32 against int32 (same size) is a
// mismatch, not a reinterpretation.
TEST(ShmGroup, RawByteCollectivesCompareTheirPayload) {
  const std::string name = unique_name("payload");
  const auto codes = run_ranks(2, [&](int rank) {
    ShmGroup group(options(name, rank, 2));
    std::vector<int32_t> mine(4, rank), all(8, 0);
    try {
      group.all_gather(mine.data(), all.data(), mine.size() * sizeof(int32_t),
                       rank == 0 ? "Float" : "Int");
    } catch (const std::runtime_error& e) {
      const std::string what = e.what();
      if (what.find("16 bytes of Float") == std::string::npos ||
          what.find("16 bytes of Int") == std::string::npos) {
        return 7;
      }
      group.broadcast(mine.data(), mine.size() * sizeof(int32_t), 1, "Int");  // still usable
      return mine[0] == 1 ? 0 : 9;
    }
    return 8;
  });
  EXPECT_EQ(codes, std::vector<int>({0, 0}));
}

TEST(ShmGroup, SegmentIsRemovedOnceAllRanksAttach) {
  const std::string name = unique_name("cleanup");
  const auto codes = run_ranks(2, [&](int rank) {
    ShmGroup group(options(name, rank, 2));
    group.barrier();
    return access(("/dev/shm" + name).c_str(), F_OK) == 0 ? 9 : 0;
  });
  EXPECT_EQ(codes, std::vector<int>({0, 0}));
}

// Set-up that fails (a rank never attaches) leaves no segment behind either.
TEST(ShmGroup, SegmentIsRemovedWhenSetUpTimesOut) {
  const std::string name = unique_name("setup-timeout");
  GroupOptions o = options(name, 0, 2);
  o.timeout = std::chrono::milliseconds(300);
  EXPECT_THROW(ShmGroup group(o), std::runtime_error);
  EXPECT_NE(access(("/dev/shm" + name).c_str(), F_OK), 0) << "left behind: " << name;
}

TEST(ShmGroup, RejectsBadOptions) {
  EXPECT_THROW(ShmGroup(options("/tn-bad", 2, 2)), std::invalid_argument);
  EXPECT_THROW(ShmGroup(options("/tn-bad", 0, 0)), std::invalid_argument);
  EXPECT_THROW(ShmGroup(options("/tn-bad", 0, 1, 100)), std::invalid_argument);
}

TEST(ShmGroup, UnevenAllToAll) {
  const std::string name = unique_name("alltoall");
  const int size = 3;
  const auto codes = run_ranks(size, [&](int rank) {
    ShmGroup group(options(name, rank, size, 512));  // blocks larger than a slot's share
    // rank s sends (s + 1) * (d + 1) * 50 bytes to rank d, each byte = 10 * s + d
    std::vector<size_t> send(size), recv(size);
    std::vector<uint8_t> in;
    for (int d = 0; d < size; ++d) {
      send[d] = static_cast<size_t>((rank + 1) * (d + 1) * 50);
      in.insert(in.end(), send[d], static_cast<uint8_t>(10 * rank + d));
    }
    size_t total = 0;
    for (int s = 0; s < size; ++s)
      total += recv[s] = static_cast<size_t>((s + 1) * (rank + 1) * 50);
    std::vector<uint8_t> out(total, 0xFF);
    group.all_to_all(in.data(), send.data(), out.data(), recv.data());
    size_t at = 0;
    for (int s = 0; s < size; ++s) {
      for (size_t i = 0; i < recv[s]; ++i) {
        if (out[at++] != 10 * s + rank) return 1;
      }
    }
    // a wrong receive size is reported on every rank, and the group stays usable
    recv[0] += rank == 1 ? 1 : 0;
    out.resize(total + 1);
    try {
      group.all_to_all(in.data(), send.data(), out.data(), recv.data());
      return 2;
    } catch (const std::runtime_error& e) {
      if (std::string(e.what()).find("do not match") == std::string::npos) return 3;
    }
    group.barrier();
    return 0;
  });
  EXPECT_EQ(codes, std::vector<int>(size, 0));
}

// Outputs written with cache-bypassing stores (every size streams when streaming_bytes is 0),
// into buffers that start off cache-line boundaries, over several double-buffered rounds.
TEST(ShmGroup, StreamedOutputsAcrossRoundsMatchClosedForms) {
  for (int size : {2, 3}) {
    for (size_t streaming : {size_t{0}, size_t{1} << 40}) {
      const std::string name =
          unique_name("stream") + std::to_string(size) + "-" + std::to_string(streaming == 0);
      const auto codes = run_ranks(size, [&](int rank) {
        GroupOptions o = options(name, rank, size, 1024);  // 512-byte buffers
        o.streaming_bytes = streaming;
        ShmGroup group(o);
        const size_t n = 1237;  // odd: partial lines and rounds
        std::vector<float> storage(n * size + 1);
        float* v = storage.data() + 1;  // 4 bytes past the allocation's alignment
        for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(rank + 1) * static_cast<float>(i);
        group.all_reduce(v, n, ElementType::kFloat32, ReduceOp::kSum);
        const float total = static_cast<float>(size * (size + 1) / 2);
        for (size_t i = 0; i < n; ++i) {
          if (v[i] != total * static_cast<float>(i)) return 1;
        }
        std::vector<int32_t> mine(n), all(n * size + 3, -1);
        for (size_t i = 0; i < n; ++i) mine[i] = static_cast<int32_t>(rank * 100000 + i);
        group.all_gather(mine.data(), all.data() + 3, n * sizeof(int32_t));
        for (int r = 0; r < size; ++r) {
          for (size_t i = 0; i < n; ++i) {
            if (all[3 + r * n + i] != static_cast<int32_t>(r * 100000 + i)) return 2;
          }
        }
        for (size_t i = 0; i < n * size; ++i) v[i] = static_cast<float>(i % 977);
        std::vector<float> out(n + 1, -1);
        group.reduce_scatter(v, out.data() + 1, n, ElementType::kFloat32, ReduceOp::kMax);
        for (size_t i = 0; i < n; ++i) {
          if (out[1 + i] != static_cast<float>((rank * n + i) % 977)) return 3;
        }
        // SUM: with two ranks and streaming, add_streaming's one pass.
        group.reduce_scatter(v, out.data() + 1, n, ElementType::kFloat32, ReduceOp::kSum);
        for (size_t i = 0; i < n; ++i) {
          if (out[1 + i] != static_cast<float>(size * ((rank * n + i) % 977))) return 6;
        }
        // bf16 SUM (add_streaming_bf16 with two ranks); sums below 256 are exact in bf16.
        std::vector<uint16_t> hin(n * size), hout(n + 1, 0);
        for (size_t i = 0; i < hin.size(); ++i) hin[i] = to_bf16(static_cast<float>(i % 61));
        group.reduce_scatter(hin.data(), hout.data() + 1, n, ElementType::kBFloat16,
                             ReduceOp::kSum);
        for (size_t i = 0; i < n; ++i) {
          if (from_bf16(hout[1 + i]) != static_cast<float>(size * ((rank * n + i) % 61))) return 7;
        }
        std::vector<uint16_t> h(n, to_bf16(static_cast<float>(rank + 1)));
        group.all_reduce(h.data(), n, ElementType::kBFloat16, ReduceOp::kSum);
        for (uint16_t x : h) {
          if (from_bf16(x) != total) return 4;
        }
        std::vector<uint8_t> b(n + 5, rank == size - 1 ? 7 : 0);
        group.broadcast(b.data() + 5, n, size - 1);
        for (size_t i = 5; i < b.size(); ++i) {
          if (b[i] != 7) return 5;
        }
        return 0;
      });
      EXPECT_EQ(codes, std::vector<int>(size, 0)) << "size " << size << " streaming " << streaming;
    }
  }
}

// Many rounds of changing data: a rank that rewrote a buffer before its peers had read it
// would hand them the next round's values.
TEST(ShmGroup, DoubleBufferedRoundsNeverMixData) {
  const std::string name = unique_name("rounds");
  const int size = 3;  // more ranks than this host's 2 cores: ranks are descheduled mid-round
  const auto codes = run_ranks(size, [&](int rank) {
    ShmGroup group(options(name, rank, size, 512));  // 256-byte buffers: 64 floats a round
    for (int call = 0; call < 20; ++call) {
      const size_t n = 2000 + static_cast<size_t>(call);
      std::vector<float> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((rank + 1) * (call + 1)) + i;
      group.all_reduce(v.data(), n, ElementType::kFloat32, ReduceOp::kSum);
      for (size_t i = 0; i < n; ++i) {
        if (v[i] != static_cast<float>(6 * (call + 1)) + 3.0f * i) return 1;
      }
      std::vector<int32_t> mine(n, rank * 1000 + call), all(n * size);
      group.all_gather(mine.data(), all.data(), n * sizeof(int32_t));
      for (int r = 0; r < size; ++r) {
        for (size_t i = 0; i < n; ++i) {
          if (all[r * n + i] != r * 1000 + call) return 2;
        }
      }
    }
    return 0;
  });
  EXPECT_EQ(codes, std::vector<int>(size, 0));
}

// A rank that waits long sleeps (its CPU goes to others) and is woken as soon as the late
// rank arrives, not at its next poll.
TEST(ShmGroup, AWaitingRankSleepsAndWakesPromptly) {
  const std::string name = unique_name("sleep");
  auto* arrival = static_cast<std::atomic<int64_t>*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(arrival, MAP_FAILED);
  auto now_ns = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  const auto codes = run_ranks(2, [&](int rank) {
    ShmGroup group(options(name, rank, 2));
    group.barrier();
    if (rank == 1) {
      usleep(400 * 1000);
      arrival->store(now_ns());
      group.barrier();
      return 0;
    }
    timespec cpu0{}, cpu1{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu0);
    group.barrier();
    const int64_t woken_after = now_ns() - arrival->load();
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu1);
    const double cpu_ms = (cpu1.tv_sec - cpu0.tv_sec) * 1e3 + (cpu1.tv_nsec - cpu0.tv_nsec) / 1e6;
    fprintf(stderr, "waiting rank: %.1f ms of CPU in 400 ms, woken %.2f ms after the arrival\n",
            cpu_ms, woken_after / 1e6);
    if (cpu_ms > 15) return 1;  // spins and yields under 1 ms, then sleeps (polling: ~50)
    return woken_after < 50000000 ? 0 : 2;  // 50 ms: generous for a loaded 2-core host
  });
  munmap(arrival, 4096);
  EXPECT_EQ(codes, std::vector<int>({0, 0}));
}
