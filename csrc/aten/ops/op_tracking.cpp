// The per-op counters behind get_executed_ops, get_fallback_ops and get_synchronizing_ops
// (op_tracking.h).
#include "ops/op_tracking.h"

#include <memory>
#include <mutex>
#include <unordered_map>

namespace torchneuron {
namespace {

struct Registry {
  std::mutex mutex;
  std::unordered_map<const void*, std::unique_ptr<OpCounter>> by_key;
  std::unordered_map<std::string, OpCounter*> by_name;
};

Registry& registry() {
  static Registry* instance = new Registry();  // never destroyed: counters outlive statics
  return *instance;
}

OpCounter& insert(Registry& r, const void* key, const std::string& name) {
  auto named = r.by_name.find(name);
  if (named != r.by_name.end()) return *named->second;
  auto counter = std::make_unique<OpCounter>();
  counter->name = name;
  OpCounter* raw = counter.get();
  r.by_key.emplace(key, std::move(counter));
  r.by_name.emplace(name, raw);
  return *raw;
}

template <typename Field>
std::map<std::string, uint64_t> collect(Field field) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::map<std::string, uint64_t> result;
  for (const auto& [key, counter] : r.by_key) {
    const uint64_t value = ((*counter).*field).load(std::memory_order_relaxed);
    if (value > 0) result[counter->name] = value;
  }
  return result;
}

}  // namespace

OpCounter& op_counter(const void* key, const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.by_key.find(key);
  return it != r.by_key.end() ? *it->second : insert(r, key, name);
}

OpCounter& op_counter_named(const std::string& name) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.by_name.find(name);
  if (it != r.by_name.end()) return *it->second;
  auto owned = std::make_unique<OpCounter>();
  owned->name = name;
  OpCounter* raw = owned.get();
  r.by_key.emplace(raw, std::move(owned));
  r.by_name.emplace(name, raw);
  return *raw;
}

std::map<std::string, uint64_t> executed_ops() { return collect(&OpCounter::executed); }

std::map<std::string, uint64_t> fallback_ops() { return collect(&OpCounter::fallback); }

std::map<std::string, uint64_t> synchronizing_ops() { return collect(&OpCounter::synchronizing); }

void clear_op_tracking() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (auto& [key, counter] : r.by_key) {
    counter->executed.store(0, std::memory_order_relaxed);
    counter->fallback.store(0, std::memory_order_relaxed);
    counter->synchronizing.store(0, std::memory_order_relaxed);
  }
}

}  // namespace torchneuron
