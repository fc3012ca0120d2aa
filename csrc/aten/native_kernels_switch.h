// TORCHNEURON_NATIVE_KERNELS=0 turns the native kernels (csrc/kernels) off: every op then
// runs PyTorch's CPU kernel over device memory, as before they existed. Read once.
#pragma once

namespace torchneuron {

bool native_kernels_enabled();

}  // namespace torchneuron
