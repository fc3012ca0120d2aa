// The CPU allocator wrapper installed at load time, and the thread-local device it serves
// allocations from while a host kernel runs (allocation_redirect.h).
#include "memory/allocation_redirect.h"

#include <c10/core/CPUAllocator.h>

#include <cstring>

#include "memory/caching_allocator.h"

namespace torchneuron {
namespace {

thread_local c10::DeviceIndex tls_target_device = -1;
c10::DeleterFnPtr g_host_raw_deleter = nullptr;

// raw_allocate() may have been served from device memory (while redirected), so the raw
// deleter checks the owner first.
void raw_delete(void* ptr) {
  if (!CachingAllocator::free_if_owned(ptr) && g_host_raw_deleter != nullptr) {
    g_host_raw_deleter(ptr);
  }
}

class RedirectingCPUAllocator final : public c10::Allocator {
 public:
  RedirectingCPUAllocator() : host_(c10::GetCPUAllocator()) {
    g_host_raw_deleter = host_->raw_deleter();
  }

  c10::DataPtr allocate(size_t nbytes) override {
    if (tls_target_device < 0) return host_->allocate(nbytes);
    c10::DataPtr data = caching_allocator().allocate_on(tls_target_device, nbytes);
    data.unsafe_set_device(c10::Device(c10::DeviceType::CPU));
    return data;
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return g_host_raw_deleter != nullptr ? &raw_delete : nullptr;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    if (count > 0) std::memcpy(dest, src, count);
  }

 private:
  c10::Allocator* host_;
};

RedirectingCPUAllocator* install() {
  static RedirectingCPUAllocator* redirect = [] {
    auto* allocator = new RedirectingCPUAllocator();
    // Priority 1 wins over the default CPU allocator (priority 0).
    c10::SetCPUAllocator(allocator, /*priority=*/1);
    return allocator;
  }();
  return redirect;
}

// Installed when the extension loads, before any neuron op can run.
[[maybe_unused]] RedirectingCPUAllocator* const g_installed = install();

}  // namespace

c10::Allocator* redirecting_cpu_allocator() { return install(); }

DeviceAllocationScope::DeviceAllocationScope(c10::DeviceIndex device)
    : previous_(tls_target_device) {
  tls_target_device = device;
}

DeviceAllocationScope::~DeviceAllocationScope() { tls_target_device = previous_; }

}  // namespace torchneuron
