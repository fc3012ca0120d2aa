// The segments of the caching allocator: carving blocks out of free ones, merging freed
// blocks with free neighbours of their segment, and giving whole free segments back.
#include "memory/cache_segments.h"

#include "device/runtime_status.h"
#include "memory/cache_stats.h"
#include "neuron_runtime.h"

namespace torchneuron::cache {

Block* SegmentPools::take_free(BlockPool& pool, c10::StreamId stream, size_t size) {
  Block key{device_, stream, size, nullptr, false};
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  // A request does not take a cached block from a much larger dedicated segment: that
  // would pin the rest. Shared 20 MiB segments serve any medium request.
  if ((*it)->size > kMediumSegment && (*it)->size > 2 * size + kLargeRounding) return nullptr;
  Block* block = *it;
  pool.erase(it);
  if (block->prev != nullptr || block->next != nullptr) {
    stat_sub(stats_.inactive_split, block->small, 1);
    stat_sub(stats_.inactive_split_bytes, block->small, block->size);
  }
  return block;
}

Block* SegmentPools::split(Block* block, size_t size, BlockPool& pool) {
  const size_t remaining = block->size - size;
  const bool worth_splitting = block->small ? remaining >= kMinBlockSize : remaining > kSmallSize;
  if (!worth_splitting) return block;
  auto* rest = new Block{device_, block->stream, remaining, static_cast<char*>(block->ptr) + size,
                         block->small};
  rest->prev = block;
  rest->next = block->next;
  if (rest->next != nullptr) rest->next->prev = rest;
  block->next = rest;
  block->size = size;
  pool.insert(rest);
  stat_add(stats_.inactive_split, rest->small, 1);
  stat_add(stats_.inactive_split_bytes, rest->small, rest->size);
  return block;
}

// Merges an inactive block with free neighbours into its pool.
void SegmentPools::return_to_pool(Block* block) {
  BlockPool& pool = block->small ? small_free_ : large_free_;
  merge_with(block, block->prev, pool);
  merge_with(block, block->next, pool);
  if (block->prev != nullptr || block->next != nullptr) {
    stat_add(stats_.inactive_split, block->small, 1);
    stat_add(stats_.inactive_split_bytes, block->small, block->size);
  }
  pool.insert(block);
}

void SegmentPools::merge_with(Block* block, Block* neighbour, BlockPool& pool) {
  if (neighbour == nullptr || neighbour->allocated || neighbour->pending_events > 0) return;
  if (pool.erase(neighbour) == 0) return;  // it is not free in this pool
  stat_sub(stats_.inactive_split, neighbour->small, 1);
  stat_sub(stats_.inactive_split_bytes, neighbour->small, neighbour->size);
  if (neighbour == block->prev) {
    block->ptr = neighbour->ptr;
    block->prev = neighbour->prev;
    if (block->prev != nullptr) block->prev->next = block;
  } else {
    block->next = neighbour->next;
    if (block->next != nullptr) block->next->prev = block;
  }
  block->size += neighbour->size;
  delete neighbour;
}

void SegmentPools::release_whole_segments(BlockPool& pool) {
  for (auto it = pool.begin(); it != pool.end();) {
    Block* block = *it;
    if (block->prev == nullptr && block->next == nullptr) {
      NEURON_CHECK(nrt_mem_free(device_, block->ptr));
      stats_.num_device_free += 1;
      stat_sub(stats_.segment, block->small, 1);
      stat_sub(stats_.reserved_bytes, block->small, block->size);
      it = pool.erase(it);
      delete block;
    } else {
      ++it;
    }
  }
}

Block* SegmentPools::add_segment(void* ptr, size_t bytes, c10::StreamId stream, bool small) {
  stats_.num_device_alloc += 1;
  stat_add(stats_.segment, small, 1);
  stat_add(stats_.reserved_bytes, small, bytes);
  return new Block{device_, stream, bytes, ptr, small};
}

void SegmentPools::release_whole_segments() {
  release_whole_segments(small_free_);
  release_whole_segments(large_free_);
}

}  // namespace torchneuron::cache
