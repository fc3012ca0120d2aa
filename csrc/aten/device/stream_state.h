// Neuron streams as c10::Stream: the StreamId is the runtime's per-device stream index
// (0 = default stream). The current stream is tracked per thread and per device.
#pragma once

#include <c10/core/Stream.h>

namespace torchneuron {

c10::Stream default_stream(c10::DeviceIndex device);
c10::Stream current_stream(c10::DeviceIndex device);
// Makes `stream` current on its device for this thread; returns the previous one.
c10::Stream exchange_stream(c10::Stream stream);
// A stream from a small per-device, per-priority round-robin pool (created lazily).
c10::Stream pooled_stream(c10::DeviceIndex device, int priority);
// A brand-new stream.
c10::Stream new_stream(c10::DeviceIndex device, int priority);

}  // namespace torchneuron
