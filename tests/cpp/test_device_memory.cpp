// Tests of device memory: exact accounting, out-of-memory messages, and the host budget shared
// by every device.
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "runtime_test_support.h"

namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = kKiB * 1024;
constexpr uint64_t kGiB = kMiB * 1024;

using DeviceMemoryTest = RuntimeTest;

uint64_t used_on(int device) {
  uint64_t used = ~uint64_t{0};
  EXPECT_NRT_OK(nrt_mem_get_info(device, &used, nullptr));
  return used;
}

uint64_t host_used() {
  uint64_t used = 0;
  nrt_host_budget(&used, nullptr);
  return used;
}

TEST_F(DeviceMemoryTest, ZeroBytesGivesNull) {
  void* ptr = reinterpret_cast<void*>(0x1);
  ASSERT_NRT_OK(nrt_mem_alloc(0, 0, &ptr));
  EXPECT_EQ(ptr, nullptr);
  EXPECT_EQ(used_on(0), 0u);
  EXPECT_NRT_OK(nrt_mem_free(0, nullptr));
}

TEST_F(DeviceMemoryTest, AccountingIsExactAndMemoryIsUsable) {
  uint64_t capacity = 0;
  ASSERT_NRT_OK(nrt_mem_get_info(0, nullptr, &capacity));
  nrt_device_properties props{};
  ASSERT_NRT_OK(nrt_device_get_properties(0, &props));
  EXPECT_EQ(capacity, props.capacity_bytes);

  const size_t sizes[] = {1, 100, 4096, 256 * 1024 - 1, 256 * 1024, 3 * kMiB + 7};
  std::vector<void*> ptrs;
  uint64_t expected = 0;
  for (size_t size : sizes) {
    void* ptr = nullptr;
    ASSERT_NRT_OK(nrt_mem_alloc(0, size, &ptr));
    ASSERT_NE(ptr, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(ptr) % 64, 0u) << size;
    std::memset(ptr, 0x5a, size);  // the whole region is writable
    EXPECT_EQ(static_cast<unsigned char*>(ptr)[size - 1], 0x5a);
    ptrs.push_back(ptr);
    expected += size;
    EXPECT_EQ(used_on(0), expected);
    EXPECT_EQ(host_used(), expected);
  }
  EXPECT_EQ(used_on(1), 0u);
  for (size_t i = 0; i < ptrs.size(); ++i) {
    ASSERT_NRT_OK(nrt_mem_free(0, ptrs[i]));
    expected -= sizes[i];
    EXPECT_EQ(used_on(0), expected);
  }
  EXPECT_EQ(host_used(), 0u);
}

TEST_F(DeviceMemoryTest, DeviceCapacityOutOfMemoryNamesDeviceAndSizes) {
  setenv("TORCHNEURON_HOST_MEMORY_BUDGET", "1MiB", 1);
  uint64_t capacity = 0;
  ASSERT_NRT_OK(nrt_mem_get_info(0, nullptr, &capacity));
  ASSERT_EQ(capacity, kMiB);  // min(24 GiB of HBM, 1 MiB budget)

  void* a = nullptr;
  ASSERT_NRT_OK(nrt_mem_alloc(0, 768 * kKiB, &a));
  void* b = reinterpret_cast<void*>(0x1);
  EXPECT_EQ(nrt_mem_alloc(0, 512 * kKiB, &b), NRT_OUT_OF_MEMORY);
  EXPECT_EQ(b, nullptr);
  const std::string message = last_error();
  EXPECT_CONTAINS(message, "neuron:0");
  EXPECT_CONTAINS(message, "512.00 KiB");
  EXPECT_CONTAINS(message, "768.00 KiB of 1.00 MiB");
  EXPECT_EQ(used_on(0), 768 * kKiB);  // the failed request left no trace
  EXPECT_EQ(host_used(), 768 * kKiB);

  void* c = nullptr;  // exactly filling the capacity is allowed
  ASSERT_NRT_OK(nrt_mem_alloc(0, 256 * kKiB, &c));
  EXPECT_EQ(used_on(0), kMiB);
  EXPECT_EQ(nrt_mem_alloc(0, 1, &b), NRT_OUT_OF_MEMORY);
  EXPECT_NRT_OK(nrt_mem_free(0, a));
  EXPECT_NRT_OK(nrt_mem_free(0, c));
}

TEST_F(DeviceMemoryTest, HostBudgetIsSharedByAllDevices) {
  setenv("TORCHNEURON_HOST_MEMORY_BUDGET", "1MiB", 1);
  void* a = nullptr;
  ASSERT_NRT_OK(nrt_mem_alloc(0, 768 * kKiB, &a));
  void* b = nullptr;
  EXPECT_EQ(nrt_mem_alloc(1, 512 * kKiB, &b), NRT_OUT_OF_MEMORY);
  const std::string message = last_error();
  EXPECT_CONTAINS(message, "neuron:1");
  EXPECT_CONTAINS(message, "512.00 KiB");
  EXPECT_CONTAINS(message, "host memory budget");
  EXPECT_CONTAINS(message, "768.00 KiB of 1.00 MiB");
  EXPECT_CONTAINS(message, "TORCHNEURON_HOST_MEMORY_BUDGET");
  EXPECT_EQ(used_on(1), 0u);
  ASSERT_NRT_OK(nrt_mem_alloc(1, 256 * kKiB, &b));
  EXPECT_NRT_OK(nrt_mem_free(0, a));
  EXPECT_NRT_OK(nrt_mem_free(1, b));
  EXPECT_EQ(host_used(), 0u);
}

TEST_F(DeviceMemoryTest, LargeRequestBeyondHbmIsRefused) {
  setenv("TORCHNEURON_HOST_MEMORY_BUDGET", "1TiB", 1);
  void* ptr = nullptr;
  EXPECT_EQ(nrt_mem_alloc(0, 25 * kGiB, &ptr), NRT_OUT_OF_MEMORY);
  EXPECT_CONTAINS(last_error(), "25.00 GiB");
  EXPECT_CONTAINS(last_error(), "0 B of 24.00 GiB");
}

TEST_F(DeviceMemoryTest, HostBudgetParsing) {
  const std::pair<const char*, uint64_t> good[] = {
      {"1.5GiB", 3 * kGiB / 2}, {"1024", 1024},      {"512k", 512 * kKiB},
      {"2 M", 2 * kMiB},        {"1t", 1024 * kGiB}, {"64B", 64},
      {"0.5KiB", 512},          {"3mib", 3 * kMiB},  {" 7G ", 7 * kGiB},
  };
  for (const auto& g : good) {
    ASSERT_NRT_OK(nrt_reset_for_testing());
    setenv("TORCHNEURON_HOST_MEMORY_BUDGET", g.first, 1);
    ASSERT_NRT_OK(nrt_init()) << g.first;
    uint64_t budget = 0;
    nrt_host_budget(nullptr, &budget);
    EXPECT_EQ(budget, g.second) << g.first;
  }
  for (const char* bad : {"abc", "", "1.5XB", "1GB", "-1", "0", "1..5G", "G", "99999999999T"}) {
    ASSERT_NRT_OK(nrt_reset_for_testing());
    setenv("TORCHNEURON_HOST_MEMORY_BUDGET", bad, 1);
    EXPECT_EQ(nrt_init(), NRT_INVALID_CONFIG) << bad;
    EXPECT_CONTAINS(last_error(), "TORCHNEURON_HOST_MEMORY_BUDGET");
  }
}

TEST_F(DeviceMemoryTest, DefaultBudgetIsThreeQuartersOfRam) {
  uint64_t budget = 0;
  nrt_host_budget(nullptr, &budget);
  const uint64_t ram = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                       static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE));
  EXPECT_GT(budget, ram / 4 * 3 - 2 * static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE)) * 4);
  EXPECT_LE(budget, ram / 4 * 3);
}

TEST_F(DeviceMemoryTest, FreeingAnUnknownPointerIsAnInvalidHandle) {
  int local = 0;
  EXPECT_EQ(nrt_mem_free(0, &local), NRT_INVALID_HANDLE);
  EXPECT_CONTAINS(last_error(), "neuron:0");
  void* ptr = nullptr;
  ASSERT_NRT_OK(nrt_mem_alloc(0, 128, &ptr));
  EXPECT_EQ(nrt_mem_free(1, ptr), NRT_INVALID_HANDLE);  // belongs to another device
  EXPECT_EQ(nrt_mem_free(0, static_cast<char*>(ptr) + 64), NRT_INVALID_HANDLE);
  ASSERT_NRT_OK(nrt_mem_free(0, ptr));
  EXPECT_EQ(nrt_mem_free(0, ptr), NRT_INVALID_HANDLE);  // double free
  EXPECT_EQ(used_on(0), 0u);
}

TEST_F(DeviceMemoryTest, BadArguments) {
  void* ptr = nullptr;
  EXPECT_EQ(nrt_mem_alloc(0, 16, nullptr), NRT_INVALID_ARGUMENT);
  EXPECT_EQ(nrt_mem_alloc(4, 16, &ptr), NRT_INVALID_DEVICE);
  EXPECT_CONTAINS(last_error(), "invalid device index 4");
  EXPECT_EQ(nrt_mem_alloc(-1, 16, &ptr), NRT_INVALID_DEVICE);
  EXPECT_EQ(nrt_mem_free(7, nullptr), NRT_INVALID_DEVICE);
  EXPECT_EQ(nrt_mem_get_info(4, nullptr, nullptr), NRT_INVALID_DEVICE);
}

TEST_F(DeviceMemoryTest, ResetRefusesWhileMemoryIsHeld) {
  void* ptr = nullptr;
  ASSERT_NRT_OK(nrt_mem_alloc(2, 1000, &ptr));
  EXPECT_EQ(nrt_reset_for_testing(), NRT_INVALID_ARGUMENT);
  EXPECT_CONTAINS(last_error(), "neuron:2 holds 1000 B");
  EXPECT_EQ(nrt_is_initialized(), 1);
  ASSERT_NRT_OK(nrt_mem_free(2, ptr));
  EXPECT_NRT_OK(nrt_reset_for_testing());
  EXPECT_EQ(nrt_is_initialized(), 0);
}

TEST_F(DeviceMemoryTest, ConcurrentAllocAndFreeKeepExactCounts) {
  ASSERT_NRT_OK(nrt_init());
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &failures] {
      std::vector<std::pair<void*, size_t>> held;
      uint32_t seed = 12345u + static_cast<uint32_t>(t);
      for (int i = 0; i < 2000; ++i) {
        seed = seed * 1664525u + 1013904223u;
        const size_t size = 1 + (seed >> 8) % (300 * 1024);  // both small and mmap'ed
        void* ptr = nullptr;
        if (nrt_mem_alloc(t % 2, size, &ptr) != NRT_SUCCESS || ptr == nullptr) {
          ++failures[t];
          continue;
        }
        static_cast<char*>(ptr)[0] = static_cast<char>(i);
        static_cast<char*>(ptr)[size - 1] = static_cast<char>(i);
        held.emplace_back(ptr, size);
        if (held.size() > 8 || (seed & 1)) {
          if (nrt_mem_free(t % 2, held.front().first) != NRT_SUCCESS) ++failures[t];
          held.erase(held.begin());
        }
      }
      for (const auto& h : held) {
        if (nrt_mem_free(t % 2, h.first) != NRT_SUCCESS) ++failures[t];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
  EXPECT_EQ(used_on(0), 0u);
  EXPECT_EQ(used_on(1), 0u);
  EXPECT_EQ(host_used(), 0u);
}

}  // namespace
