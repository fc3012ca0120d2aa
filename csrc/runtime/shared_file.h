// Host memory other processes can map: an anonymous memory file (memfd) whose size is sealed.
// The kernel keeps its pages while any process holds a descriptor or a mapping of it, so
// passing the descriptor (SCM_RIGHTS, fork, spawn) is all the reference counting sharing
// needs, and nothing is ever left behind in a file system.
#pragma once

#include <cstddef>
#include <string>

#include "neuron_runtime.h"

namespace nrt {

// Creates a memory file of exactly nbytes (> 0) named `name` (shown in /proc/<pid>/maps as
// "/memfd:<name>"), close-on-exec, with its size sealed: no process can shrink it under
// another's mapping (which would turn reads into SIGBUS).
nrt_status shared_file_create(const std::string& name, size_t nbytes, int* out_fd);

// Checks that fd is a size-sealed memory file of exactly nbytes (what shared_file_create
// makes), so that mapping it cannot fault later.
nrt_status shared_file_check(int fd, size_t nbytes);

// Maps the whole file read-write and shared.
nrt_status shared_file_map(int fd, size_t nbytes, void** out_ptr);

}  // namespace nrt
