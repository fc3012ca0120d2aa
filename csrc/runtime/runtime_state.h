// The initialised runtime as the other files see it: the visible devices, each with its
// memory arena and streams, reached through lazily-initialising lookups.
#pragma once

#include <memory>
#include <string>

#include "device_memory.h"
#include "neuron_runtime.h"
#include "stream.h"

namespace nrt {

struct Device {
  Device(int index, const nrt_device_properties& properties);
  const int index;
  const std::string label;  // "neuron:<index>"
  nrt_device_properties properties;
  DeviceArena arena;
  StreamSet streams;
};

// "neuron:<index>".
std::string device_label(int device);

// NRT_FORKED_CHILD (with the spawn advice) in a child forked after initialisation.
nrt_status check_not_forked();
// Initialises the runtime if needed; returns the (sticky) init error or NRT_FORKED_CHILD.
nrt_status ensure_initialized();
// Initialises if needed and finds a visible device (NRT_INVALID_DEVICE otherwise).
nrt_status lookup_device(int device, Device** out);
// As lookup_device, then finds a stream of it (NRT_INVALID_HANDLE otherwise).
nrt_status lookup_stream(int device, int stream, std::shared_ptr<Stream>* out);

}  // namespace nrt
