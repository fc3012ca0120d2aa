// Shared fixture for the runtime tests: a clean environment and a reset runtime per test.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "neuron_runtime.h"

inline void clear_runtime_env() {
  for (const char* name :
       {"NEURON_PLATFORM_TARGET_OVERRIDE", "NEURON_LOGICAL_NC_CONFIG", "TORCHNEURON_CHIPS",
        "NEURON_RT_VISIBLE_CORES", "TORCHNEURON_HOST_MEMORY_BUDGET", "NEURON_LAUNCH_BLOCKING"}) {
    unsetenv(name);
  }
}

class RuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    clear_runtime_env();
    ASSERT_EQ(nrt_reset_for_testing(), NRT_SUCCESS) << nrt_last_error();
  }
  void TearDown() override {
    clear_runtime_env();
    EXPECT_EQ(nrt_reset_for_testing(), NRT_SUCCESS) << nrt_last_error();
  }
};

inline std::string last_error() { return nrt_last_error(); }

#define EXPECT_CONTAINS(haystack, needle)                                   \
  do {                                                                      \
    const std::string nrt_haystack_ = (haystack);                           \
    EXPECT_NE(nrt_haystack_.find(needle), std::string::npos)                \
        << "expected to find \"" << (needle) << "\" in: " << nrt_haystack_; \
  } while (0)

#define ASSERT_NRT_OK(expr) ASSERT_EQ((expr), NRT_SUCCESS) << nrt_last_error()
#define EXPECT_NRT_OK(expr) EXPECT_EQ((expr), NRT_SUCCESS) << nrt_last_error()
