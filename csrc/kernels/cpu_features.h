// What the host CPU can execute, read once at run time (CPUID and the OS's saved-state
// mask), so kernels pick their instructions per host instead of per build.
#pragma once

#include <string>

namespace neuron::kernels {

// The instruction-set levels kernels are written for, best last.
enum class IsaLevel { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3, kAmxBf16 = 4 };

struct CpuFeatures {
  bool avx2 = false;    // with FMA and F16C
  bool avx512 = false;  // F, BW, VL, DQ
  bool avx512_bf16 = false;
  bool amx_bf16 = false;  // AMX-TILE + AMX-BF16, and the OS granted the tile state
  std::string model;      // the CPU's brand string
};

// Read once; thread-safe.
const CpuFeatures& cpu_features();

// The best level the host supports, whatever TORCHNEURON_KERNEL_ISA says.
IsaLevel host_isa_level();

// The best level the host supports, capped by TORCHNEURON_KERNEL_ISA (scalar, avx2,
// avx512, avx512_bf16, amx_bf16) when set, so tests and benchmarks can force a lower path.
IsaLevel isa_level();

const char* isa_name(IsaLevel level);

// CPUs this process may run on (its affinity mask; else the online count). Read each call.
int usable_cpus();

}  // namespace neuron::kernels
