// Argument checks and helpers shared by the c10d backend's files: the element type of a
// tensor, its bytes (read and written in place), the one tensor of a per-rank list, and a
// completed Work.
#pragma once

#include <ATen/ATen.h>

#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "shm_group.h"

namespace torchneuron {

nrt::dist::ElementType element_type(const at::Tensor& t);

// The tensor's bytes, read and written in place: device memory is host-addressable.
void* host_bytes(const at::Tensor& t, const char* what);

// The one tensor of a per-rank list (one device per process).
at::Tensor& single(std::vector<at::Tensor>& tensors, const char* what);

// A Work that is already done (operations run synchronously on the calling thread).
c10::intrusive_ptr<c10d::Work> completed(std::vector<at::Tensor> outputs);

}  // namespace torchneuron
