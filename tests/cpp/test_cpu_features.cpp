// cpu_features() against what the kernel reports in /proc/cpuinfo, and the ISA cap.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "cpu_features.h"

namespace {

std::set<std::string> proc_cpuinfo_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0) {
      std::istringstream words(line.substr(line.find(':') + 1));
      std::set<std::string> flags;
      for (std::string w; words >> w;) flags.insert(w);
      return flags;
    }
  }
  return {};
}

}  // namespace

TEST(CpuFeatures, AgreeWithProcCpuinfo) {
  const auto flags = proc_cpuinfo_flags();
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags line (not x86 Linux)";
  const auto& f = neuron::kernels::cpu_features();
  EXPECT_EQ(f.avx2, flags.count("avx2") && flags.count("fma") && flags.count("f16c"));
  EXPECT_EQ(f.avx512, f.avx2 && flags.count("avx512f") && flags.count("avx512bw") &&
                          flags.count("avx512vl") && flags.count("avx512dq"));
  EXPECT_EQ(f.avx512_bf16, f.avx512 && flags.count("avx512_bf16"));
  if (f.amx_bf16) EXPECT_TRUE(flags.count("amx_bf16") && flags.count("amx_tile"));
  EXPECT_FALSE(f.model.empty());
}

TEST(CpuFeatures, LevelIsTheBestSupported) {
  const auto& f = neuron::kernels::cpu_features();
  using neuron::kernels::IsaLevel;
  const IsaLevel level = neuron::kernels::isa_level();  // no cap set in this process
  const IsaLevel want = f.amx_bf16      ? IsaLevel::kAmxBf16
                        : f.avx512_bf16 ? IsaLevel::kAvx512Bf16
                        : f.avx512      ? IsaLevel::kAvx512
                        : f.avx2        ? IsaLevel::kAvx2
                                        : IsaLevel::kScalar;
  EXPECT_EQ(level, want);
  EXPECT_STREQ(neuron::kernels::isa_name(IsaLevel::kAvx512Bf16), "avx512_bf16");
}
