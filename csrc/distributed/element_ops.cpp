// The reductions of the collectives (element_ops.h), element by element, and the choice of the
// AVX2 or AVX-512 version by the host's instruction-set level.
#include "element_ops.h"

#include <stdexcept>

#include "cpu_features.h"
#include "element_kernels.h"

namespace nrt::dist {

#if defined(__x86_64__)
// element_ops.avx2.cpp and element_ops.avx512.cpp
void combine_avx2(void* dst, const void* a, const void* b, size_t count, ElementType type,
                  ReduceOp op);
void combine_avx512(void* dst, const void* a, const void* b, size_t count, ElementType type,
                    ReduceOp op);
#endif

size_t element_size(ElementType type) {
  switch (type) {
    case ElementType::kFloat64:
    case ElementType::kInt64:
      return 8;
    case ElementType::kFloat32:
    case ElementType::kInt32:
      return 4;
    case ElementType::kBFloat16:
    case ElementType::kFloat16:
      return 2;
    case ElementType::kInt8:
    case ElementType::kUInt8:
    case ElementType::kBool:
      return 1;
  }
  throw std::invalid_argument("unknown element type");
}

const char* element_type_name(ElementType type) {
  static const char* const names[] = {"float32", "float64", "bfloat16", "float16", "int8",
                                      "uint8",   "int32",   "int64",    "bool"};
  return names[static_cast<size_t>(type)];
}

const char* reduce_op_name(ReduceOp op) {
  static const char* const names[] = {"SUM", "PRODUCT", "MAX", "MIN"};
  return names[static_cast<size_t>(op)];
}

void combine_with(neuron::kernels::IsaLevel level, void* dst, const void* a, const void* b,
                  size_t count, ElementType type, ReduceOp op) {
#if defined(__x86_64__)
  if (level >= neuron::kernels::IsaLevel::kAvx512) {
    return combine_avx512(dst, a, b, count, type, op);
  }
  if (level >= neuron::kernels::IsaLevel::kAvx2) return combine_avx2(dst, a, b, count, type, op);
#else
  (void)level;
#endif
  combine_all<ScalarCodec>(dst, a, b, count, type, op);
}

void combine(void* dst, const void* a, const void* b, size_t count, ElementType type, ReduceOp op) {
  static const neuron::kernels::IsaLevel level = neuron::kernels::isa_level();
  combine_with(level, dst, a, b, count, type, op);
}

}  // namespace nrt::dist
