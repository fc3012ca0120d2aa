// Tests of the built-in chip profiles: their order, lookup by name, and each chip's figures.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "neuron_runtime.h"

namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kMiB = uint64_t{1} << 20;

TEST(ChipProfile, ListsThreeProfilesInOrder) {
  ASSERT_EQ(nrt_chip_profile_count(), 3);
  EXPECT_STREQ(nrt_chip_profile_at(0)->name, "trn1");
  EXPECT_STREQ(nrt_chip_profile_at(1)->name, "trn2");
  EXPECT_STREQ(nrt_chip_profile_at(2)->name, "trn3");
  EXPECT_EQ(nrt_chip_profile_at(-1), nullptr);
  EXPECT_EQ(nrt_chip_profile_at(3), nullptr);
}

TEST(ChipProfile, FindIsCaseInsensitiveAndExact) {
  const nrt_chip_profile* trn2 = nrt_chip_profile_find("trn2");
  ASSERT_NE(trn2, nullptr);
  EXPECT_EQ(trn2, nrt_chip_profile_at(1));
  EXPECT_EQ(nrt_chip_profile_find("TRN2"), trn2);
  EXPECT_EQ(nrt_chip_profile_find("Trn1"), nrt_chip_profile_at(0));
  EXPECT_EQ(nrt_chip_profile_find("tRN3"), nrt_chip_profile_at(2));
  EXPECT_STREQ(nrt_chip_profile_find("TRN3")->name, "trn3");  // stored lower-case
  for (const char* bad : {"trn4", "trn", "trn22", "", " trn2", "inf2"}) {
    EXPECT_EQ(nrt_chip_profile_find(bad), nullptr) << bad;
  }
  EXPECT_EQ(nrt_chip_profile_find(nullptr), nullptr);
}

TEST(ChipProfile, Trn1Figures) {
  const nrt_chip_profile* p = nrt_chip_profile_find("trn1");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->physical_cores_per_chip, 2);
  EXPECT_EQ(p->default_logical_nc_config, 1);
  EXPECT_EQ(p->max_logical_nc_config, 1);
  EXPECT_EQ(p->hbm_bytes_per_chip, 32 * kGiB);
  EXPECT_DOUBLE_EQ(p->hbm_bandwidth_bytes_per_s, 820e9);
  EXPECT_DOUBLE_EQ(p->peak_bf16_flops_per_chip, 190e12);
  EXPECT_DOUBLE_EQ(p->peak_fp32_flops_per_chip, 47.5e12);
  EXPECT_EQ(p->sbuf_bytes_per_core, 24 * kMiB);
}

TEST(ChipProfile, Trn2Figures) {
  const nrt_chip_profile* p = nrt_chip_profile_find("trn2");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->physical_cores_per_chip, 8);
  EXPECT_EQ(p->default_logical_nc_config, 2);
  EXPECT_EQ(p->max_logical_nc_config, 2);
  EXPECT_EQ(p->hbm_bytes_per_chip, 96 * kGiB);
  EXPECT_DOUBLE_EQ(p->hbm_bandwidth_bytes_per_s, 2.9e12);
  EXPECT_DOUBLE_EQ(p->peak_bf16_flops_per_chip, 667e12);
  EXPECT_DOUBLE_EQ(p->peak_fp32_flops_per_chip, 181e12);
  EXPECT_EQ(p->sbuf_bytes_per_core, 28 * kMiB);
}

TEST(ChipProfile, Trn3Figures) {
  const nrt_chip_profile* p = nrt_chip_profile_find("trn3");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->physical_cores_per_chip, 8);
  EXPECT_EQ(p->default_logical_nc_config, 2);
  EXPECT_EQ(p->max_logical_nc_config, 2);
  EXPECT_EQ(p->hbm_bytes_per_chip, 144 * kGiB);
  EXPECT_DOUBLE_EQ(p->hbm_bandwidth_bytes_per_s, 4.9e12);
  EXPECT_DOUBLE_EQ(p->peak_bf16_flops_per_chip, 671e12);
  EXPECT_DOUBLE_EQ(p->peak_fp32_flops_per_chip, 0.0);  // unpublished
  EXPECT_EQ(p->sbuf_bytes_per_core, 32 * kMiB);
}

TEST(ChipProfile, ProfilesNeedNoInitialisation) {
  // Pure data: looking profiles up must not read the environment or build the topology.
  EXPECT_NE(nrt_chip_profile_find("trn2"), nullptr);
  EXPECT_EQ(nrt_is_initialized(), 0);
}

}  // namespace
