// The device memory allocator: caches blocks carved from runtime segments so that the
// steady state of a training or generation loop never calls the runtime. Stream-aware: a
// block is reused only on the stream it was allocated on, and a block used on other streams
// (recordStream) returns to the pool only after those streams reach the free.
#pragma once

#include <c10/core/CachingDeviceAllocator.h>

#include <string>
#include <vector>

namespace torchneuron {

class CachingAllocator final : public c10::DeviceAllocator {
 public:
  // Allocates on the calling thread's current device and stream.
  c10::DataPtr allocate(size_t nbytes) override;
  c10::DataPtr allocate_on(c10::DeviceIndex device, size_t nbytes);
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  bool initialized() override;
  void emptyCache(c10::MempoolId_t mempool_id = {0, 0}) override;
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override;
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex device) override;
  void resetAccumulatedStats(c10::DeviceIndex device) override;
  void resetPeakStats(c10::DeviceIndex device) override;
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex device) override;

  // Counts memory this allocator does not manage (shared storages mapped by this process) in
  // the device's stats as one allocation in its own segment, so memory_allocated() and
  // memory_reserved() cover every neuron tensor of the process. `mapped` false uncounts it.
  void count_external(c10::DeviceIndex device, size_t nbytes, bool mapped);

  // True when the memory behind data_ptr came from this allocator.
  static bool owns(const c10::DataPtr& data_ptr);
  // Frees ptr if it is a live block of this allocator; false otherwise.
  static bool free_if_owned(void* ptr);
};

CachingAllocator& caching_allocator();

// While alive on a stream worker running launched work (async_launch.h):
//  - an allocation of exactly a reserved block's size is served from that block (each block
//    once) without owning it: the block already belongs to a result its caller holds, so the
//    kernel writes that result in place; freeing a served block does nothing;
//  - every other allocation comes from a pool of the worker's own for `stream`, never from
//    the pool the launching thread frees into. Why: a block the caller freed may still be
//    read by work queued behind the running task; only work queued after the free may reuse
//    it, and the caller's later allocations are exactly that.
class ReservedAllocations {
 public:
  struct Block {
    void* ptr;
    size_t nbytes;
    bool served;
  };
  // `blocks` may be null (the worker's pool only).
  ReservedAllocations(std::vector<Block>* blocks, c10::StreamId stream);
  ~ReservedAllocations();
  ReservedAllocations(const ReservedAllocations&) = delete;
  ReservedAllocations& operator=(const ReservedAllocations&) = delete;

 private:
  std::vector<Block>* previous_blocks_;
  c10::StreamId previous_pool_;
};

// Sizes in the out-of-memory message ("512 bytes", "2.00 GiB"). Not nrt::format_bytes
// (csrc/runtime/bytes.h): that one prints "512 B" and goes on to PiB and EiB, so sharing it
// would change the message's text.
std::string format_bytes(uint64_t bytes);

}  // namespace torchneuron
