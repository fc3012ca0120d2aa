// The collectives of ShmGroup (shm_group.h): all_reduce, all_gather, reduce_scatter,
// broadcast and all_to_all through the double-buffered staging of each rank's slot, and
// the reductions they share. The group's set-up, barrier and failure checks are in
// shm_group.cpp.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "bulk_copy.h"
#include "element_ops.h"
#include "shm_group.h"
#include "streaming_sum.h"

namespace nrt::dist {

void ShmGroup::reduce_sources(char* dst, const char* const* sources, size_t count, ElementType type,
                              ReduceOp op) {
  const bool aliased = std::find(sources + 2, sources + size_, dst) != sources + size_;
  if (!aliased) {
    combine(dst, sources[0], sources[1], count, type, op);
    for (int s = 2; s < size_; ++s) reduce_into(dst, sources[s], count, type, op);
    return;
  }
  // Through a tile in L1: dst is a source other than the first two, and must not be
  // overwritten before it is read.
  const size_t esize = element_size(type);
  alignas(64) char tile[kReduceTileBytes];
  const size_t per_tile = kReduceTileBytes / esize;
  for (size_t done = 0; done < count; done += per_tile) {
    const size_t n = std::min(per_tile, count - done);
    const size_t at = done * esize;
    combine(tile, sources[0] + at, sources[1] + at, n, type, op);
    for (int s = 2; s < size_; ++s) reduce_into(tile, sources[s] + at, n, type, op);
    std::memcpy(dst + at, tile, n * esize);
  }
}

bool ShmGroup::sum_streaming(char* dst, const char* a, const char* b, size_t count,
                             ElementType type, ReduceOp op, char* cached) const {
  if (size_ != 2 || op != ReduceOp::kSum) return false;
  if (type == ElementType::kFloat32) {
    add_streaming(reinterpret_cast<float*>(dst), reinterpret_cast<const float*>(a),
                  reinterpret_cast<const float*>(b), count, reinterpret_cast<float*>(cached));
    return true;
  }
  // bf16 where add_streaming_bf16 is vectorised (AVX2): 1.5-1.9x the general path for
  // reduce_scatter and all_reduce at 16-256 MiB.
  if (type == ElementType::kBFloat16 && bf16_sum_vectorised()) {
    add_streaming_bf16(reinterpret_cast<uint16_t*>(dst), reinterpret_cast<const uint16_t*>(a),
                       reinterpret_cast<const uint16_t*>(b), count,
                       reinterpret_cast<uint16_t*>(cached));
    return true;
  }
  return false;
}

// Every collective moves data in rounds through double-buffered staging: in round k a rank
// writes its buffer k&1, arrives, and reads its peers' buffers k&1. It writes that buffer
// again in round k+2, after the barrier of round k+1, which no rank passes before every rank
// has finished reading round k: so one barrier per round suffices (two for all_reduce, whose
// rounds also exchange the reduced shares). Rounds restart at buffer 0 in each collective:
// the barrier of begin() comes after every rank has finished the previous one.
void ShmGroup::all_reduce(void* data, size_t count, ElementType type, ReduceOp op, Finish finish) {
  begin(Kind::kAllReduce, count, type, reduction_extra(op, finish));
  const size_t esize = element_size(type);
  auto* bytes = static_cast<char*>(data);
  const bool stream = count * esize >= streaming_bytes_;
  std::vector<const char*> sources(size_);
  if (count * esize <= std::min(kSmallAllReduceBytes, buffer_bytes())) {
    // Small: one barrier; every rank reduces all buffers itself, in rank order, so all get
    // the same bits.
    std::memcpy(buffer(rank_, 0), bytes, count * esize);
    arrive_and_wait("all_reduce");
    for (int s = 0; s < size_; ++s) sources[s] = buffer(s, 0);
    if (size_ > 1 && count > 0) {
      reduce_sources(bytes, sources.data(), count, type, op);
    }
    return;
  }
  // Larger: rank r reduces share r of each round (so each element is reduced once, by one
  // rank, in rank order) from its own input and the peers' buffers, so it stages only the
  // shares its peers reduce; it puts the result in its buffer for them, and copies theirs.
  const size_t per_round = buffer_bytes() / esize;
  const size_t unit = std::max<size_t>(1, 64 / esize);  // shares start on cache lines
  uint64_t round = 0;
  for (size_t offset = 0; offset < count; offset += per_round, ++round) {
    const size_t n = std::min(per_round, count - offset);
    const size_t share = (n + unit * size_ - 1) / (unit * size_) * unit;
    const size_t lo = std::min(n, share * rank_);
    const size_t hi = std::min(n, lo + share);
    char* mine = buffer(rank_, round);
    char* in = bytes + offset * esize;
    std::memcpy(mine, in, lo * esize);
    std::memcpy(mine + hi * esize, in + hi * esize, (n - hi) * esize);
    arrive_and_wait("all_reduce");
    if (hi > lo) {
      for (int s = 0; s < size_; ++s) {
        sources[s] = (s == rank_ ? in : buffer(s, round)) + lo * esize;
      }
      // Into the output and the buffer for the peer in one pass where sum_streaming can.
      if (!stream || !sum_streaming(in + lo * esize, sources[0], sources[1], hi - lo, type, op,
                                    mine + lo * esize)) {
        reduce_sources(mine + lo * esize, sources.data(), hi - lo, type, op);
        copy_from_staging(in + lo * esize, mine + lo * esize, (hi - lo) * esize, stream);
      }
    }
    arrive_and_wait("all_reduce");
    for (int s = 0; s < size_; ++s) {
      const size_t from = std::min(n, share * s);
      const size_t to = std::min(n, from + share);
      if (s != rank_ && to > from) {
        copy_from_staging(in + from * esize, buffer(s, round) + from * esize, (to - from) * esize,
                          stream);
      }
    }
  }
}

void ShmGroup::all_gather(const void* in, void* out, size_t bytes, const char* payload) {
  begin(Kind::kAllGather, bytes, ElementType::kUInt8, 0, payload);
  if (bytes == 0) return arrive_and_wait("all_gather");  // descriptions stay until all read
  const auto* src = static_cast<const char*>(in);
  auto* dst = static_cast<char*>(out);
  const bool stream = bytes * size_ >= streaming_bytes_;
  const size_t per_round = buffer_bytes();
  uint64_t round = 0;
  for (size_t offset = 0; offset < bytes; offset += per_round, ++round) {
    const size_t n = std::min(per_round, bytes - offset);
    // Into the buffer for the peers and into this rank's own part, reading `in` once.
    copy_twice(buffer(rank_, round), dst + bytes * rank_ + offset, src + offset, n, stream);
    arrive_and_wait("all_gather");
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) copy_from_staging(dst + bytes * r + offset, buffer(r, round), n, stream);
    }
  }
}

void ShmGroup::reduce_scatter(const void* in, void* out, size_t count, ElementType type,
                              ReduceOp op, Finish finish) {
  begin(Kind::kReduceScatter, count, type, reduction_extra(op, finish));
  if (count == 0) return arrive_and_wait("reduce_scatter");
  const size_t esize = element_size(type);
  const auto* src = static_cast<const char*>(in);
  auto* dst = static_cast<char*>(out);
  const bool stream = count * esize >= streaming_bytes_;
  // Each buffer holds one region per destination; this rank's own block is read from `in`.
  size_t region = buffer_bytes() / static_cast<size_t>(size_);
  if (region >= 64) region = region / 64 * 64;
  const size_t per_round = region / esize;
  std::vector<const char*> sources(size_);
  uint64_t round = 0;
  for (size_t offset = 0; offset < count; offset += per_round, ++round) {
    const size_t n = std::min(per_round, count - offset);
    char* mine = buffer(rank_, round);
    for (int d = 0; d < size_; ++d) {
      if (d != rank_) {
        std::memcpy(mine + d * region, src + (d * count + offset) * esize, n * esize);
      }
    }
    arrive_and_wait("reduce_scatter");
    for (int s = 0; s < size_; ++s) {
      sources[s] =
          s == rank_ ? src + (rank_ * count + offset) * esize : buffer(s, round) + rank_ * region;
    }
    if (size_ == 1) {
      copy_from_staging(dst + offset * esize, sources[0], n * esize, stream);
    } else if (!stream ||
               !sum_streaming(dst + offset * esize, sources[0], sources[1], n, type, op)) {
      // Cached stores otherwise: streaming through an L1 tile cost more CPU than the
      // output-line reads it saves (bf16 at 16-64 MiB: 0.76-0.87x as fast).
      reduce_sources(dst + offset * esize, sources.data(), n, type, op);
    }
  }
}

void ShmGroup::broadcast(void* data, size_t bytes, int root, const char* payload) {
  if (root < 0 || root >= size_) {
    throw std::invalid_argument("broadcast root " + std::to_string(root) +
                                " is outside a group of " + std::to_string(size_));
  }
  begin(Kind::kBroadcast, bytes, ElementType::kUInt8, static_cast<uint32_t>(root), payload);
  if (bytes == 0) return arrive_and_wait("broadcast");
  auto* buf = static_cast<char*>(data);
  const bool stream = bytes >= streaming_bytes_;
  const size_t per_round = buffer_bytes();
  uint64_t round = 0;
  for (size_t offset = 0; offset < bytes; offset += per_round, ++round) {
    const size_t n = std::min(per_round, bytes - offset);
    if (rank_ == root) std::memcpy(buffer(root, round), buf + offset, n);
    arrive_and_wait("broadcast");
    if (rank_ != root) copy_from_staging(buf + offset, buffer(root, round), n, stream);
  }
}

void ShmGroup::all_to_all(const void* in, const size_t* send_bytes, void* out,
                          const size_t* recv_bytes) {
  // Every rank learns the whole send matrix first: it fixes the number of rounds and lets
  // each rank check its receive sizes against what its peers send.
  std::vector<uint64_t> mine(send_bytes, send_bytes + size_);
  std::vector<uint64_t> matrix(static_cast<size_t>(size_) * size_);
  all_gather(mine.data(), matrix.data(), mine.size() * sizeof(uint64_t));
  auto sent = [&](int from, int to) { return matrix[static_cast<size_t>(from) * size_ + to]; };
  std::string wrong;
  for (int s = 0; s < size_; ++s) {
    if (sent(s, rank_) != recv_bytes[s]) {
      wrong = "rank " + std::to_string(s) + " sends " + std::to_string(sent(s, rank_)) +
              " bytes to rank " + std::to_string(rank_) + ", which expects " +
              std::to_string(recv_bytes[s]);
      break;
    }
  }
  // Agree on failure before moving data, so every rank raises instead of one waiting.
  uint8_t bad = wrong.empty() ? 0 : 1;
  all_reduce(&bad, 1, ElementType::kUInt8, ReduceOp::kMax);
  if (bad != 0) {
    throw std::runtime_error(
        "all_to_all split sizes do not match across ranks" +
        (wrong.empty() ? std::string(" (reported by another rank)") : ": " + wrong));
  }
  uint64_t largest = 0;
  for (uint64_t b : matrix) largest = std::max(largest, b);
  begin(Kind::kAllToAll, largest, ElementType::kUInt8, 0);
  if (largest == 0) return arrive_and_wait("all_to_all");
  size_t block = buffer_bytes() / static_cast<size_t>(size_);
  if (block >= 64) block = block / 64 * 64;
  std::vector<size_t> send_offset(size_, 0), recv_offset(size_, 0);
  for (int r = 1; r < size_; ++r) {
    send_offset[r] = send_offset[r - 1] + send_bytes[r - 1];
    recv_offset[r] = recv_offset[r - 1] + recv_bytes[r - 1];
  }
  const auto* src = static_cast<const char*>(in);
  auto* dst = static_cast<char*>(out);
  uint64_t round = 0;
  for (uint64_t done = 0; done < largest; done += block, ++round) {
    for (int d = 0; d < size_; ++d) {
      if (send_bytes[d] > done) {
        std::memcpy(buffer(rank_, round) + d * block, src + send_offset[d] + done,
                    std::min<uint64_t>(block, send_bytes[d] - done));
      }
    }
    arrive_and_wait("all_to_all");
    for (int s = 0; s < size_; ++s) {
      if (recv_bytes[s] > done) {
        copy_from_staging(dst + recv_offset[s] + done, buffer(s, round) + rank_ * block,
                          std::min<uint64_t>(block, recv_bytes[s] - done), false);
      }
    }
  }
}

}  // namespace nrt::dist
