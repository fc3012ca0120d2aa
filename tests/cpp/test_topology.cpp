// Tests of the topology read from the environment: chips, logical-core grouping and visible
// cores, and the reasons given for malformed values.
#include <string>
#include <thread>
#include <vector>

#include "runtime_test_support.h"

namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

using TopologyTest = RuntimeTest;

int device_count() {
  int count = -1;
  EXPECT_NRT_OK(nrt_device_count(&count));
  return count;
}

nrt_device_properties properties(int device) {
  nrt_device_properties props{};
  EXPECT_NRT_OK(nrt_device_get_properties(device, &props));
  return props;
}

// Sets NEURON_RT_VISIBLE_CORES, reads the topology afresh and returns the init status.
nrt_status init_with_visible_cores(const char* value) {
  EXPECT_NRT_OK(nrt_reset_for_testing());
  setenv("NEURON_RT_VISIBLE_CORES", value, 1);
  return nrt_init();
}

TEST_F(TopologyTest, DefaultIsOneTrn2ChipWithFourLogicalCores) {
  EXPECT_EQ(nrt_is_initialized(), 0);
  ASSERT_EQ(device_count(), 4);  // lazily initialises
  EXPECT_EQ(nrt_is_initialized(), 1);
  for (int i = 0; i < 4; ++i) {
    const nrt_device_properties p = properties(i);
    EXPECT_STREQ(p.name, "NeuronCore-v3 (trn2, LNC=2)");
    EXPECT_EQ(p.chip, nrt_chip_profile_find("trn2"));
    EXPECT_EQ(p.logical_nc_config, 2);
    EXPECT_EQ(p.physical_core_first, 2 * i);
    EXPECT_EQ(p.chip_index, 0);
    EXPECT_EQ(p.hbm_bytes, 24 * kGiB);
    EXPECT_DOUBLE_EQ(p.hbm_bandwidth_bytes_per_s, 2.9e12 / 4);
    EXPECT_DOUBLE_EQ(p.peak_bf16_flops, 667e12 / 4);
    EXPECT_DOUBLE_EQ(p.peak_fp32_flops, 181e12 / 4);
    EXPECT_LE(p.capacity_bytes, p.hbm_bytes);
  }
}

TEST_F(TopologyTest, Trn1HasTwoCoresOfSixteenGiB) {
  setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "TRN1", 1);
  ASSERT_EQ(device_count(), 2);
  const nrt_device_properties p = properties(1);
  EXPECT_STREQ(p.name, "NeuronCore-v2 (trn1, LNC=1)");
  EXPECT_EQ(p.logical_nc_config, 1);
  EXPECT_EQ(p.physical_core_first, 1);
  EXPECT_EQ(p.hbm_bytes, 16 * kGiB);
  EXPECT_DOUBLE_EQ(p.peak_fp32_flops, 47.5e12 / 2);
}

TEST_F(TopologyTest, Trn3AndLncOne) {
  setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn3", 1);
  setenv("NEURON_LOGICAL_NC_CONFIG", "1", 1);
  ASSERT_EQ(device_count(), 8);
  const nrt_device_properties p = properties(7);
  EXPECT_STREQ(p.name, "NeuronCore-v4 (trn3, LNC=1)");
  EXPECT_EQ(p.physical_core_first, 7);
  EXPECT_EQ(p.hbm_bytes, 18 * kGiB);
  EXPECT_DOUBLE_EQ(p.hbm_bandwidth_bytes_per_s, 4.9e12 / 8);
  EXPECT_DOUBLE_EQ(p.peak_fp32_flops, 0.0);
}

TEST_F(TopologyTest, SeveralChips) {
  setenv("TORCHNEURON_CHIPS", "2", 1);
  ASSERT_EQ(device_count(), 8);
  EXPECT_EQ(properties(3).chip_index, 0);
  EXPECT_EQ(properties(4).chip_index, 1);
  EXPECT_EQ(properties(5).physical_core_first, 10);
  ASSERT_NRT_OK(nrt_reset_for_testing());
  setenv("TORCHNEURON_CHIPS", "64", 1);
  setenv("NEURON_LOGICAL_NC_CONFIG", "1", 1);
  ASSERT_EQ(device_count(), 512);
  EXPECT_EQ(properties(511).chip_index, 63);
}

TEST_F(TopologyTest, VisibleCoresSelectAndRenumber) {
  ASSERT_NRT_OK(init_with_visible_cores("3,0-1"));
  ASSERT_EQ(device_count(), 3);
  EXPECT_EQ(properties(0).physical_core_first, 0);
  EXPECT_EQ(properties(1).physical_core_first, 2);
  EXPECT_EQ(properties(2).physical_core_first, 6);
  nrt_device_properties p{};
  EXPECT_EQ(nrt_device_get_properties(3, &p), NRT_INVALID_DEVICE);
  EXPECT_CONTAINS(last_error(), "invalid device index 3");

  ASSERT_NRT_OK(init_with_visible_cores(" 1 , 2 - 3 "));
  ASSERT_EQ(device_count(), 3);
  EXPECT_EQ(properties(0).physical_core_first, 2);
  EXPECT_EQ(properties(2).physical_core_first, 6);

  ASSERT_NRT_OK(init_with_visible_cores("2"));
  ASSERT_EQ(device_count(), 1);
  EXPECT_EQ(properties(0).physical_core_first, 4);

  ASSERT_NRT_OK(init_with_visible_cores(""));
  EXPECT_EQ(device_count(), 4);
}

TEST_F(TopologyTest, MalformedVisibleCoresAreRejectedWithAReason) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {",0", "empty item"},
      {"0,,1", "empty item"},
      {"0,", "empty item"},
      {"a", "'a' is not a core index"},
      {"1-x", "not a core index"},
      {"3-1", "reversed"},
      {"1-", "has no end"},
      {"-1", "negative"},
      {"0,0", "more than once"},
      {"0-2,1", "core 1 is listed more than once"},
      {"4", "core 4 does not exist"},
      {"2-9", "core 4 does not exist"},
      {"99999999999999", "not a core index"},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(init_with_visible_cores(c.first), NRT_INVALID_CONFIG) << c.first;
    const std::string message = last_error();
    EXPECT_CONTAINS(message, std::string("NEURON_RT_VISIBLE_CORES=\"") + c.first + "\"");
    EXPECT_CONTAINS(message, c.second);
    EXPECT_CONTAINS(message,
                    "valid logical cores are 0-3 for trn2 with NEURON_LOGICAL_NC_CONFIG=2 and 1 "
                    "chip");
  }
}

TEST_F(TopologyTest, VisibleCoresRangeFollowsLncAndChips) {
  setenv("NEURON_LOGICAL_NC_CONFIG", "1", 1);
  setenv("TORCHNEURON_CHIPS", "2", 1);
  EXPECT_EQ(init_with_visible_cores("16"), NRT_INVALID_CONFIG);
  EXPECT_CONTAINS(last_error(),
                  "valid logical cores are 0-15 for trn2 with NEURON_LOGICAL_NC_CONFIG=1 and 2 "
                  "chips");
  ASSERT_NRT_OK(init_with_visible_cores("14-15"));
  EXPECT_EQ(device_count(), 2);
  EXPECT_EQ(properties(1).chip_index, 1);
}

TEST_F(TopologyTest, UnknownPlatformListsKnownProfiles) {
  setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn9", 1);
  EXPECT_EQ(nrt_init(), NRT_INVALID_CONFIG);
  EXPECT_CONTAINS(last_error(), "\"trn9\"");
  EXPECT_CONTAINS(last_error(), "trn1, trn2, trn3");
  EXPECT_EQ(nrt_is_initialized(), 0);
}

TEST_F(TopologyTest, LncMustBeAllowedByTheProfile) {
  setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn1", 1);
  setenv("NEURON_LOGICAL_NC_CONFIG", "2", 1);
  EXPECT_EQ(nrt_init(), NRT_INVALID_CONFIG);
  EXPECT_CONTAINS(last_error(), "NEURON_LOGICAL_NC_CONFIG=\"2\"");
  EXPECT_CONTAINS(last_error(), "the only allowed value is 1");
  for (const char* bad : {"3", "x", "", "0", "-1", "1.5"}) {
    ASSERT_NRT_OK(nrt_reset_for_testing());
    setenv("NEURON_PLATFORM_TARGET_OVERRIDE", "trn2", 1);
    setenv("NEURON_LOGICAL_NC_CONFIG", bad, 1);
    EXPECT_EQ(nrt_init(), NRT_INVALID_CONFIG) << bad;
    EXPECT_CONTAINS(last_error(), "allowed values are 1 and 2");
  }
}

TEST_F(TopologyTest, ChipsMustBeOneToSixtyFour) {
  for (const char* bad : {"0", "65", "x", "", "-2", "1.0"}) {
    ASSERT_NRT_OK(nrt_reset_for_testing());
    setenv("TORCHNEURON_CHIPS", bad, 1);
    EXPECT_EQ(nrt_init(), NRT_INVALID_CONFIG) << bad;
    EXPECT_CONTAINS(last_error(), "TORCHNEURON_CHIPS");
    EXPECT_CONTAINS(last_error(), "from 1 to 64");
  }
}

TEST_F(TopologyTest, ConfigErrorIsStickyUntilReset) {
  setenv("NEURON_LOGICAL_NC_CONFIG", "3", 1);
  EXPECT_EQ(nrt_init(), NRT_INVALID_CONFIG);
  unsetenv("NEURON_LOGICAL_NC_CONFIG");  // fixing the environment alone is not enough
  EXPECT_EQ(nrt_init(), NRT_INVALID_CONFIG);
  int count = 0;
  EXPECT_EQ(nrt_device_count(&count), NRT_INVALID_CONFIG);
  void* ptr = nullptr;
  EXPECT_EQ(nrt_mem_alloc(0, 16, &ptr), NRT_INVALID_CONFIG);
  EXPECT_CONTAINS(last_error(), "NEURON_LOGICAL_NC_CONFIG=\"3\"");
  ASSERT_NRT_OK(nrt_reset_for_testing());
  EXPECT_NRT_OK(nrt_init());
  EXPECT_EQ(device_count(), 4);
}

TEST_F(TopologyTest, InitReadsTheEnvironmentOnce) {
  ASSERT_NRT_OK(nrt_init());
  setenv("NEURON_RT_VISIBLE_CORES", "0", 1);
  EXPECT_NRT_OK(nrt_init());
  EXPECT_EQ(device_count(), 4);
}

TEST_F(TopologyTest, CapacityIsCappedByTheHostBudget) {
  setenv("TORCHNEURON_HOST_MEMORY_BUDGET", "1GiB", 1);
  const nrt_device_properties p = properties(0);
  EXPECT_EQ(p.hbm_bytes, 24 * kGiB);
  EXPECT_EQ(p.capacity_bytes, 1 * kGiB);
}

TEST_F(TopologyTest, BadArguments) {
  EXPECT_EQ(nrt_device_count(nullptr), NRT_INVALID_ARGUMENT);
  EXPECT_EQ(nrt_device_get_properties(0, nullptr), NRT_INVALID_ARGUMENT);
  nrt_device_properties p{};
  EXPECT_EQ(nrt_device_get_properties(-1, &p), NRT_INVALID_DEVICE);
  EXPECT_CONTAINS(last_error(), "4 neuron devices are visible (0-3)");
}

TEST(StatusNames, NameEveryStatus) {
  EXPECT_STREQ(nrt_status_name(NRT_SUCCESS), "NRT_SUCCESS");
  EXPECT_STREQ(nrt_status_name(NRT_INVALID_CONFIG), "NRT_INVALID_CONFIG");
  EXPECT_STREQ(nrt_status_name(NRT_OUT_OF_MEMORY), "NRT_OUT_OF_MEMORY");
  EXPECT_STREQ(nrt_status_name(NRT_FORKED_CHILD), "NRT_FORKED_CHILD");
  EXPECT_STREQ(nrt_status_name(static_cast<nrt_status>(42)), "NRT_UNKNOWN_STATUS");
}

TEST(LastError, IsPerThread) {
  clear_runtime_env();
  ASSERT_NRT_OK(nrt_reset_for_testing());
  EXPECT_EQ(nrt_device_count(nullptr), NRT_INVALID_ARGUMENT);
  EXPECT_CONTAINS(last_error(), "count is NULL");
  std::string other = "unset";
  std::thread([&] { other = nrt_last_error(); }).join();
  EXPECT_EQ(other, "");
}

}  // namespace
