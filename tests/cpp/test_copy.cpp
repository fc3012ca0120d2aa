// Tests of the runtime's copies and memset: host/device round trips, across devices, overlap,
// stream order and argument validation.
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "runtime_test_support.h"

namespace {

using CopyTest = RuntimeTest;

TEST_F(CopyTest, RoundTripThroughDeviceMemory) {
  std::vector<uint8_t> host(1 << 20);
  std::iota(host.begin(), host.end(), 0);
  void* dev = nullptr;
  ASSERT_NRT_OK(nrt_mem_alloc(0, host.size(), &dev));
  ASSERT_NRT_OK(nrt_memcpy(0, 0, dev, host.data(), host.size()));
  std::vector<uint8_t> back(host.size(), 0);
  ASSERT_NRT_OK(nrt_memcpy(0, 0, back.data(), dev, back.size()));
  ASSERT_NRT_OK(nrt_stream_synchronize(0, 0));
  EXPECT_EQ(back, host);
  EXPECT_NRT_OK(nrt_mem_free(0, dev));
}

TEST_F(CopyTest, DeviceToDeviceAcrossDevices) {
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_NRT_OK(nrt_mem_alloc(0, 4096, &a));
  ASSERT_NRT_OK(nrt_mem_alloc(1, 4096, &b));
  ASSERT_NRT_OK(nrt_memset(0, 0, a, 0x3c, 4096));
  // Streams of different devices are not ordered with each other: the copy on device 1
  // waits for the fill on device 0 through an event, as a program must (without it the copy
  // raced the fill and read zeros in 3 of 5 runs).
  nrt_event_t filled = nullptr;
  ASSERT_NRT_OK(nrt_event_create(NRT_EVENT_DEFAULT, &filled));
  ASSERT_NRT_OK(nrt_event_record(filled, 0, 0));
  ASSERT_NRT_OK(nrt_stream_wait_event(1, 0, filled));
  ASSERT_NRT_OK(nrt_memcpy(1, 0, b, a, 4096));
  ASSERT_NRT_OK(nrt_device_synchronize(1));
  EXPECT_NRT_OK(nrt_event_destroy(filled));
  const auto* bytes = static_cast<const uint8_t*>(b);
  for (int i = 0; i < 4096; ++i) ASSERT_EQ(bytes[i], 0x3c) << i;
  EXPECT_NRT_OK(nrt_mem_free(0, a));
  EXPECT_NRT_OK(nrt_mem_free(1, b));
}

TEST_F(CopyTest, MemsetUsesTheLowByteAndOnlyTheRange) {
  std::vector<uint8_t> buf(64, 0);
  ASSERT_NRT_OK(nrt_memset(0, 0, buf.data() + 8, 0x1ab, 16));
  ASSERT_NRT_OK(nrt_stream_synchronize(0, 0));
  for (int i = 0; i < 64; ++i) EXPECT_EQ(buf[i], (i >= 8 && i < 24) ? 0xab : 0) << i;
}

TEST_F(CopyTest, OverlappingCopyIsWellDefined) {
  std::vector<uint8_t> buf(32);
  std::iota(buf.begin(), buf.end(), 0);
  ASSERT_NRT_OK(nrt_memcpy(0, 0, buf.data() + 4, buf.data(), 16));
  ASSERT_NRT_OK(nrt_stream_synchronize(0, 0));
  for (int i = 0; i < 16; ++i) EXPECT_EQ(buf[4 + i], i);
}

struct FillArgs {
  uint32_t* dst;
  size_t count;
};

void fill_with_index(void* arg) {
  auto* f = static_cast<FillArgs*>(arg);
  for (size_t i = 0; i < f->count; ++i) f->dst[i] = static_cast<uint32_t>(i * 3 + 1);
}

TEST_F(CopyTest, CopiesRunInStreamOrderAfterLaunchedWork) {
  int s = 0;
  ASSERT_NRT_OK(nrt_stream_create(2, 0, &s));
  void* dev = nullptr;
  ASSERT_NRT_OK(nrt_mem_alloc(2, 1024 * sizeof(uint32_t), &dev));
  FillArgs fill{static_cast<uint32_t*>(dev), 1024};
  std::vector<uint32_t> out(1024, 0);
  ASSERT_NRT_OK(nrt_memset(2, s, dev, 0, 1024 * sizeof(uint32_t)));
  ASSERT_NRT_OK(nrt_stream_launch(2, s, fill_with_index, &fill));
  ASSERT_NRT_OK(nrt_memcpy(2, s, out.data(), dev, out.size() * sizeof(uint32_t)));
  ASSERT_NRT_OK(nrt_memset(2, s, dev, 0, 1024 * sizeof(uint32_t)));  // after the copy
  ASSERT_NRT_OK(nrt_stream_synchronize(2, s));
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], i * 3 + 1) << i;
  EXPECT_EQ(static_cast<uint32_t*>(dev)[5], 0u);
  EXPECT_NRT_OK(nrt_mem_free(2, dev));
}

TEST_F(CopyTest, Validation) {
  char buf[16] = {};
  EXPECT_EQ(nrt_memcpy(0, 0, nullptr, buf, 16), NRT_INVALID_ARGUMENT);
  EXPECT_CONTAINS(last_error(), "dst is NULL");
  EXPECT_EQ(nrt_memcpy(0, 0, buf, nullptr, 16), NRT_INVALID_ARGUMENT);
  EXPECT_CONTAINS(last_error(), "src is NULL");
  EXPECT_EQ(nrt_memset(0, 0, nullptr, 0, 1), NRT_INVALID_ARGUMENT);
  EXPECT_NRT_OK(nrt_memcpy(0, 0, nullptr, nullptr, 0));  // nothing to do
  EXPECT_NRT_OK(nrt_memset(0, 0, nullptr, 0, 0));
  EXPECT_EQ(nrt_memcpy(0, 9, buf, buf + 8, 8), NRT_INVALID_HANDLE);
  EXPECT_EQ(nrt_memcpy(4, 0, buf, buf + 8, 8), NRT_INVALID_DEVICE);
  EXPECT_EQ(nrt_memset(-1, 0, buf, 0, 8), NRT_INVALID_DEVICE);
}

}  // namespace
