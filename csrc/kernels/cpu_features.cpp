// CPUID and the OS's saved-state mask read once (cpu_features.h): the host's instruction-set
// level, the one definition of it every kernel family uses, and its TORCHNEURON_KERNEL_ISA cap.
#include "cpu_features.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>

#if defined(__linux__)
#include <sched.h>
#endif
#include <unistd.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#define NEURON_KERNELS_X86 1
#endif

namespace neuron::kernels {
namespace {

#ifdef NEURON_KERNELS_X86
void cpuid(unsigned leaf, unsigned subleaf, unsigned regs[4]) {
  __cpuid_count(leaf, subleaf, regs[0], regs[1], regs[2], regs[3]);
}

unsigned long long xgetbv0() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}

// Linux hands out AMX tile state only to processes that ask for it (arch_prctl).
bool request_amx_tile_state() {
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned r[4] = {0, 0, 0, 0};
  cpuid(0, 0, r);
  const unsigned max_leaf = r[0];
  cpuid(1, 0, r);
  const bool osxsave = r[2] & (1u << 27);
  const bool fma = r[2] & (1u << 12);
  const bool f16c = r[2] & (1u << 29);
  const unsigned long long xcr0 = osxsave ? xgetbv0() : 0;
  const bool ymm_state = (xcr0 & 0x6) == 0x6;
  const bool zmm_state = (xcr0 & 0xe6) == 0xe6;
  const bool tile_state = (xcr0 & 0x60000) == 0x60000;
  if (max_leaf >= 7) {
    cpuid(7, 0, r);
    const unsigned ebx = r[1], edx = r[3];
    f.avx2 = ymm_state && fma && f16c && (ebx & (1u << 5));
    f.avx512 = f.avx2 && zmm_state && (ebx & (1u << 16)) && (ebx & (1u << 17)) &&
               (ebx & (1u << 30)) && (ebx & (1u << 31));
    const bool amx_tile = edx & (1u << 24), amx_bf16 = edx & (1u << 22);
    cpuid(7, 1, r);
    f.avx512_bf16 = f.avx512 && (r[0] & (1u << 5));
    f.amx_bf16 = f.avx512_bf16 && amx_tile && amx_bf16 && tile_state && request_amx_tile_state();
  }
  unsigned brand[12] = {};
  cpuid(0x80000000u, 0, r);
  if (r[0] >= 0x80000004u) {
    for (unsigned i = 0; i < 3; ++i) cpuid(0x80000002u + i, 0, brand + 4 * i);
    char text[49] = {};
    std::memcpy(text, brand, 48);
    f.model = text;
    const auto first = f.model.find_first_not_of(' ');
    f.model = first == std::string::npos ? "" : f.model.substr(first);
  }
  return f;
}
#else
CpuFeatures detect() { return CpuFeatures{}; }
#endif

IsaLevel best_level(const CpuFeatures& f) {
  if (f.amx_bf16) return IsaLevel::kAmxBf16;
  if (f.avx512_bf16) return IsaLevel::kAvx512Bf16;
  if (f.avx512) return IsaLevel::kAvx512;
  if (f.avx2) return IsaLevel::kAvx2;
  return IsaLevel::kScalar;
}

IsaLevel capped_level(IsaLevel best) {
  const char* cap = std::getenv("TORCHNEURON_KERNEL_ISA");
  if (cap == nullptr || *cap == '\0') return best;
  for (int level = 0; level <= static_cast<int>(IsaLevel::kAmxBf16); ++level) {
    if (std::strcmp(cap, isa_name(static_cast<IsaLevel>(level))) == 0) {
      return static_cast<IsaLevel>(level) < best ? static_cast<IsaLevel>(level) : best;
    }
  }
  throw std::invalid_argument(std::string("TORCHNEURON_KERNEL_ISA='") + cap +
                              "' is not one of scalar, avx2, avx512, avx512_bf16, amx_bf16");
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

IsaLevel host_isa_level() { return best_level(cpu_features()); }

IsaLevel isa_level() {
  static const IsaLevel level = capped_level(host_isa_level());
  return level;
}

const char* isa_name(IsaLevel level) {
  switch (level) {
    case IsaLevel::kScalar:
      return "scalar";
    case IsaLevel::kAvx2:
      return "avx2";
    case IsaLevel::kAvx512:
      return "avx512";
    case IsaLevel::kAvx512Bf16:
      return "avx512_bf16";
    case IsaLevel::kAmxBf16:
      return "amx_bf16";
  }
  return "unknown";
}

int usable_cpus() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
#endif
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

}  // namespace neuron::kernels
