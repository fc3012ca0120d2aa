// Element types and reductions of the collectives, without torch: the c10d layer maps
// torch dtypes and ReduceOps onto these.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cpu_features.h"

namespace nrt::dist {

enum class ElementType : uint8_t {
  kFloat32,
  kFloat64,
  kBFloat16,
  kFloat16,
  kInt8,
  kUInt8,
  kInt32,
  kInt64,
  kBool
};
enum class ReduceOp : uint8_t { kSum, kProduct, kMax, kMin };

size_t element_size(ElementType type);
const char* element_type_name(ElementType type);
const char* reduce_op_name(ReduceOp op);

// dst[i] = a[i] (op) b[i] for `count` elements; dst may be a or b (each element is read
// before it is written). 16-bit floats are combined in float32 and rounded back (to nearest
// even) after each combination, as Gloo's pairwise reduction. Integers wrap on overflow, and
// NaN wins max/min, as in torch.
void combine(void* dst, const void* a, const void* b, size_t count, ElementType type, ReduceOp op);

// combine() with the kernels of one instruction set, which the host must have (tests run
// every level; combine() uses neuron::kernels::isa_level(), TORCHNEURON_KERNEL_ISA caps it).
// Every level gives the same bits.
void combine_with(neuron::kernels::IsaLevel level, void* dst, const void* a, const void* b,
                  size_t count, ElementType type, ReduceOp op);

// dst[i] = dst[i] (op) src[i].
inline void reduce_into(void* dst, const void* src, size_t count, ElementType type, ReduceOp op) {
  combine(dst, dst, src, count, type, op);
}

}  // namespace nrt::dist
