// What an op's schema says about its tensor arguments (schema_arguments.h): which are written,
// which results alias which arguments.
#include "host_kernels/schema_arguments.h"

namespace torchneuron {

SchemaArguments schema_arguments(const c10::FunctionSchema& schema) {
  SchemaArguments out;
  const auto& arguments = schema.arguments();
  for (const auto& argument : arguments) {
    out.is_written.push_back(argument.alias_info() != nullptr && argument.alias_info()->isWrite());
    // Index lists (Tensor?[]) may hold CPU tensors, as on CUDA.
    out.allows_host.push_back(argument.real_type()->str() == "Tensor?[]");
  }
  for (const auto& ret : schema.returns()) {
    int alias_of = -1;
    if (ret.alias_info() != nullptr && ret.alias_info()->isWrite()) {
      for (size_t i = 0; i < arguments.size(); ++i) {
        const auto* info = arguments[i].alias_info();
        if (info != nullptr && info->beforeSets() == ret.alias_info()->beforeSets()) {
          alias_of = static_cast<int>(i);
          break;
        }
      }
    }
    out.return_aliases.push_back(alias_of);
  }
  return out;
}

}  // namespace torchneuron
