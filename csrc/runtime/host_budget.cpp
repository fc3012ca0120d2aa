// The process-wide host-memory budget every device's arena draws from (host_budget.h).
#include "host_budget.h"

#include <unistd.h>

#include <atomic>
#include <string>

#include "bytes.h"
#include "env.h"
#include "error.h"

namespace nrt {
namespace {

std::atomic<uint64_t> g_budget{0};
std::atomic<uint64_t> g_used{0};

uint64_t default_budget() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return uint64_t{4} << 30;  // unknown: assume 4 GiB
  return static_cast<uint64_t>(pages) / 4 * 3 * static_cast<uint64_t>(page_size);
}

}  // namespace

nrt_status host_budget_configure() {
  const auto value = get_env("TORCHNEURON_HOST_MEMORY_BUDGET");
  if (!value) {
    g_budget.store(default_budget());
    return NRT_SUCCESS;
  }
  uint64_t bytes = 0;
  std::string why;
  if (!parse_byte_size(*value, &bytes, &why)) {
    return fail(NRT_INVALID_CONFIG,
                "TORCHNEURON_HOST_MEMORY_BUDGET=\"" + *value + "\" is invalid: " + why);
  }
  if (bytes == 0) {
    return fail(NRT_INVALID_CONFIG, "TORCHNEURON_HOST_MEMORY_BUDGET=\"" + *value +
                                        "\" is invalid: the budget must be at least 1 byte");
  }
  g_budget.store(bytes);
  return NRT_SUCCESS;
}

uint64_t host_budget_bytes() { return g_budget.load(); }

uint64_t host_budget_used() { return g_used.load(); }

bool host_budget_try_reserve(uint64_t bytes) {
  const uint64_t budget = g_budget.load();
  uint64_t used = g_used.load();
  do {
    if (bytes > budget || used > budget - bytes) return false;
  } while (!g_used.compare_exchange_weak(used, used + bytes));
  return true;
}

void host_budget_release(uint64_t bytes) { g_used.fetch_sub(bytes); }

}  // namespace nrt

extern "C" void nrt_host_budget(uint64_t* used_bytes, uint64_t* budget_bytes) {
  // Lazily initialise so the budget reflects the environment; on a config error the
  // budget reads as 0 (the failing call that matters reports the error).
  nrt_init();
  if (used_bytes != nullptr) *used_bytes = nrt::host_budget_used();
  if (budget_bytes != nullptr) *budget_bytes = nrt::host_budget_bytes();
}
