// Which ops may launch asynchronously and what a launch needs to know about each, derived once
// per op from its schema and tags (launch_plan.h).
#include "launch/launch_plan.h"

#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "host_kernels/schema_arguments.h"

namespace torchneuron {
namespace {

// The leading arguments whose dtypes the op's CPU kernel requires to agree (0: none).
size_t same_dtype_arguments(const std::string& name) {
  static const std::unordered_map<std::string, size_t> products = {
      {"aten::mm", 2},
      {"aten::bmm", 2},
      {"aten::addmm", 3},
      {"aten::baddbmm", 3},
      {"aten::addmv", 3},
      {"aten::mv", 2},
      {"aten::_scaled_dot_product_flash_attention_for_cpu", 3},            // query, key, value
      {"aten::_scaled_dot_product_flash_attention_for_cpu_backward", 5}};  // grad_out .. out
  auto hit = products.find(name);
  return hit == products.end() ? 0 : hit->second;
}

// Ops whose meta kernel is known to describe exactly what the CPU kernel computes: every
// elementwise op, reduction and in-place op (TensorIterator's shape rules on both sides),
// foreach and fused optimizer ops, and the hot ops of transformer training and inference.
// Other meta kernels can differ (batch norm in evaluation returns empty saved statistics on
// the CPU and full-size ones on meta, embedding_bag's offset2bag has other sizes, and
// layer norm's saved statistics are float32 on meta but bfloat16 on the CPU for bfloat16
// inputs): those ops run inline, after launched work.
bool meta_matches_cpu(const c10::OperatorHandle& op) {
  if (op.hasTag(at::Tag::pointwise) || op.hasTag(at::Tag::reduction) ||
      op.hasTag(at::Tag::inplace)) {
    return true;
  }
  const std::string& qualified = op.schema().name();
  if (qualified.rfind("aten::", 0) != 0) return false;
  const std::string name = qualified.substr(6);
  if (name.rfind("_foreach_", 0) == 0 || name.rfind("_fused_", 0) == 0) return true;
  static const std::unordered_set<std::string> known = {
      "mm",
      "bmm",
      "addmm",
      "baddbmm",
      "addmv",
      "mv",
      "_softmax",
      "_log_softmax",
      "_softmax_backward_data",
      "_log_softmax_backward_data",
      "_scaled_dot_product_flash_attention_for_cpu",
      "_scaled_dot_product_flash_attention_for_cpu_backward",
      "cat",
      "stack",
      "index_select",
      "embedding",
      "embedding_dense_backward",
      "gather",
      "scatter",
      "scatter_add",
      "_to_copy",
      "constant_pad_nd",
      "tril",
      "triu",
      "cumsum",
      "arange",
      "full",
      "nll_loss_forward",
      "nll_loss_backward",
      "topk",
      "isin",
      "repeat",
      "select_backward",
      "slice_backward",
      "gelu_backward",
      "silu_backward",
      "threshold_backward",
      "sigmoid_backward",
      "tanh_backward",
      "softplus_backward",
      "_unsafe_index"};
  return known.count(name) != 0;
}

c10::TypePtr unwrap_optional(const c10::TypePtr& type) {
  if (auto optional = type->cast<c10::OptionalType>()) return optional->getElementType();
  return type;
}

bool is_tensor_or_tensor_list(const c10::TypePtr& type) {
  const c10::TypePtr plain = unwrap_optional(type);
  if (plain->kind() == c10::TypeKind::TensorType) return true;
  if (auto list = plain->cast<c10::ListType>()) {
    return unwrap_optional(list->getElementType())->kind() == c10::TypeKind::TensorType;
  }
  return false;
}

std::unique_ptr<AsyncPlan> make_plan(const c10::OperatorHandle& op) {
  auto plan = std::make_unique<AsyncPlan>();
  const c10::FunctionSchema& schema = op.schema();
  plan->name = c10::toString(schema.operator_name());
  if (!meta_matches_cpu(op)) plan->eligible = false;
  plan->same_dtype_arguments = same_dtype_arguments(schema.name());
  if (plan->same_dtype_arguments > 0) {
    const auto mask = schema.argumentIndexWithName("attn_mask");
    if (mask.has_value()) plan->mask_argument = static_cast<int>(*mask);
  }
  // Shapes that depend on data, random draws (the generator's state is read on the host)
  // and ops that change a tensor's geometry in place run inline.
  for (at::Tag tag :
       {at::Tag::dynamic_output_shape, at::Tag::data_dependent_output, at::Tag::inplace_view}) {
    if (op.hasTag(tag)) plan->eligible = false;
  }
  if (op.hasTag(at::Tag::nondeterministic_seeded)) {
    // Attention is tagged seeded for its dropout alone: without dropout it draws nothing
    // and launches like any op (launch_async checks the value).
    const auto dropout = schema.argumentIndexWithName("dropout_p");
    if (dropout.has_value() && unwrap_optional(schema.arguments()[*dropout].real_type())->kind() ==
                                   c10::TypeKind::FloatType) {
      plan->dropout_argument = static_cast<int>(*dropout);
    } else {
      plan->eligible = false;
    }
  }
  for (const auto& argument : schema.arguments()) {
    const c10::TypeKind kind = unwrap_optional(argument.real_type())->kind();
    if (kind == c10::TypeKind::GeneratorType || kind == c10::TypeKind::StorageType ||
        kind == c10::TypeKind::StreamObjType || kind == c10::TypeKind::AnyType) {
      plan->eligible = false;
    }
  }
  for (const auto& ret : schema.returns()) {
    // Results must be tensors: a number or a bool (item, equal, ...) is read from data.
    if (!is_tensor_or_tensor_list(ret.real_type())) plan->eligible = false;
  }
  SchemaArguments described = schema_arguments(schema);
  plan->is_written = std::move(described.is_written);
  plan->allows_host = std::move(described.allows_host);
  // copy_ from the host: its source is snapshotted at launch, and the meta kernel only
  // checks shapes (device_tensor_ops.cpp launches such copies while work is pending).
  if (schema.name() == "aten::copy_") plan->allows_host[1] = true;
  plan->return_aliases = std::move(described.return_aliases);
  return plan;
}

}  // namespace

AsyncPlan& plan_for(const c10::OperatorHandle& op) {
  const void* key = &op.schema();
  thread_local std::unordered_map<const void*, AsyncPlan*> cache;
  auto hit = cache.find(key);
  if (C10_LIKELY(hit != cache.end())) return *hit->second;
  static std::mutex mutex;
  static std::unordered_map<const void*, std::unique_ptr<AsyncPlan>> plans;
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = plans[key];
  if (!slot) slot = make_plan(op);
  cache.emplace(key, slot.get());
  return *slot;
}

bool runs_inline_for_values(const AsyncPlan& plan, const torch::jit::Stack& stack, size_t first) {
  std::optional<c10::ScalarType> seen;
  for (size_t i = first; i < stack.size() && i < first + plan.same_dtype_arguments; ++i) {
    if (!stack[i].isTensor() || !stack[i].toTensor().defined()) continue;
    const c10::ScalarType type = stack[i].toTensor().scalar_type();
    if (seen && *seen != type) return true;
    seen = type;
  }
  if (plan.mask_argument >= 0) {
    const c10::IValue& mask = stack[first + static_cast<size_t>(plan.mask_argument)];
    if (mask.isTensor() && mask.toTensor().defined()) {
      const c10::ScalarType type = mask.toTensor().scalar_type();
      if (type != c10::ScalarType::Float && (!seen || type != *seen)) return true;
      if (mask.toTensor().dim() != 2 && mask.toTensor().dim() != 4) return true;
    }
  }
  if (plan.dropout_argument >= 0) {
    const c10::IValue& dropout_p = stack[first + static_cast<size_t>(plan.dropout_argument)];
    if (!dropout_p.isDouble() || dropout_p.toDouble() != 0.0) return true;
  }
  return false;
}

}  // namespace torchneuron
