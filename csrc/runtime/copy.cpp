// Copies and fills between host-addressable regions, executed in stream order.
#include <cstring>
#include <memory>
#include <string>

#include "error.h"
#include "runtime_state.h"
#include "stream.h"

extern "C" nrt_status nrt_memcpy(int device, int stream, void* dst, const void* src,
                                 size_t nbytes) {
  std::shared_ptr<nrt::Stream> s;
  if (nrt_status status = nrt::lookup_stream(device, stream, &s)) return status;
  if (nbytes == 0) return NRT_SUCCESS;
  if (dst == nullptr || src == nullptr) {
    return nrt::fail(NRT_INVALID_ARGUMENT, std::string("nrt_memcpy: ") +
                                               (dst == nullptr ? "dst" : "src") +
                                               " is NULL but nbytes is " + std::to_string(nbytes));
  }
  // memmove: overlapping regions (e.g. a shift within one buffer) stay well defined.
  s->enqueue([dst, src, nbytes] { std::memmove(dst, src, nbytes); });
  return NRT_SUCCESS;
}

extern "C" nrt_status nrt_memset(int device, int stream, void* dst, int value, size_t nbytes) {
  std::shared_ptr<nrt::Stream> s;
  if (nrt_status status = nrt::lookup_stream(device, stream, &s)) return status;
  if (nbytes == 0) return NRT_SUCCESS;
  if (dst == nullptr) {
    return nrt::fail(NRT_INVALID_ARGUMENT,
                     "nrt_memset: dst is NULL but nbytes is " + std::to_string(nbytes));
  }
  s->enqueue([dst, value, nbytes] { std::memset(dst, value, nbytes); });
  return NRT_SUCCESS;
}
