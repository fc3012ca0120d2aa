// Runtime status codes turned into PyTorch errors carrying the runtime's message
// (runtime_status.h).
#include "device/runtime_status.h"

#include <string>

namespace torchneuron {

void throw_runtime_error(nrt_status status, const char* call) {
  std::string message = nrt_last_error();
  if (message.empty()) {
    message = std::string(nrt_status_name(status)) + " from " + call;
  }
  switch (status) {
    case NRT_INVALID_DEVICE:
      TORCH_CHECK_INDEX(false, message);
    case NRT_OUT_OF_MEMORY:
      TORCH_CHECK_WITH(OutOfMemoryError, false, message);
    case NRT_INVALID_ARGUMENT:
      TORCH_CHECK_VALUE(false, message);
    case NRT_FORKED_CHILD:
      TORCH_CHECK(false,
                  "Cannot use neuron in a forked subprocess: the parent process initialised "
                  "the Neuron runtime before fork(). Use the 'spawn' start method "
                  "(torch.multiprocessing.set_start_method('spawn')).");
    default:
      TORCH_CHECK(false, message);
  }
}

}  // namespace torchneuron
