// Kernels that hand a TensorIterator over neuron tensors straight to PyTorch's CPU loop
// (host_iterator_kernels.cpp); the ones other kernels call.
#pragma once

#include <ATen/core/Tensor.h>

namespace torchneuron {

// copy_ between two neuron tensors on one device, run inline through the CPU copy loop, as
// CPU eager's copy_ would run it. False, having done nothing, for the copies it leaves to the
// host copy_ over aliases: other devices, complex or differently-signed (conj/neg) operands,
// and the 2-D transposes CPU eager copies blockwise.
bool copy_within_device(at::Tensor& self, const at::Tensor& src);

}  // namespace torchneuron
