// The runtime's per-thread error state (error.h): the last failure's message, and the names
// of status codes.
#include "error.h"

#include <utility>

namespace {
thread_local std::string t_last_error;
}  // namespace

namespace nrt {

nrt_status fail(nrt_status status, std::string message) {
  t_last_error = std::move(message);
  return status;
}

}  // namespace nrt

extern "C" const char* nrt_last_error(void) { return t_last_error.c_str(); }

extern "C" const char* nrt_status_name(nrt_status status) {
  switch (status) {
    case NRT_SUCCESS:
      return "NRT_SUCCESS";
    case NRT_INVALID_ARGUMENT:
      return "NRT_INVALID_ARGUMENT";
    case NRT_INVALID_DEVICE:
      return "NRT_INVALID_DEVICE";
    case NRT_INVALID_CONFIG:
      return "NRT_INVALID_CONFIG";
    case NRT_OUT_OF_MEMORY:
      return "NRT_OUT_OF_MEMORY";
    case NRT_NOT_READY:
      return "NRT_NOT_READY";
    case NRT_INVALID_HANDLE:
      return "NRT_INVALID_HANDLE";
    case NRT_FORKED_CHILD:
      return "NRT_FORKED_CHILD";
  }
  return "NRT_UNKNOWN_STATUS";
}
