// The per-device random generators (generator.h): each wraps a CPU engine whose state is the
// device's RNG state.
#include "device/generator.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

#include <memory>
#include <mutex>
#include <vector>

#include "device/device_state.h"

namespace torchneuron {

NeuronGeneratorImpl::NeuronGeneratorImpl(c10::DeviceIndex device, uint64_t seed)
    : c10::GeneratorImpl(c10::Device(c10::DeviceType::PrivateUse1, device),
                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      engine_(at::make_generator<at::CPUGeneratorImpl>(seed)) {}

void NeuronGeneratorImpl::set_current_seed(uint64_t seed) { engine_.set_current_seed(seed); }

void NeuronGeneratorImpl::set_offset(uint64_t offset) { engine_.set_offset(offset); }

uint64_t NeuronGeneratorImpl::get_offset() const { return engine_.get_offset(); }

uint64_t NeuronGeneratorImpl::current_seed() const { return engine_.current_seed(); }

uint64_t NeuronGeneratorImpl::seed() { return engine_.seed(); }

void NeuronGeneratorImpl::set_state(const c10::TensorImpl& new_state) {
  engine_.unsafeGetGeneratorImpl()->set_state(new_state);
}

c10::intrusive_ptr<c10::TensorImpl> NeuronGeneratorImpl::get_state() const {
  return engine_.unsafeGetGeneratorImpl()->get_state();
}

NeuronGeneratorImpl* NeuronGeneratorImpl::clone_impl() const {
  auto* copy = new NeuronGeneratorImpl(device().index());
  copy->engine_ = engine_.clone();
  return copy;
}

const at::Generator& default_generator(c10::DeviceIndex device) {
  static std::once_flag created;
  static std::vector<at::Generator> generators;
  std::call_once(created, [] {
    const auto count = device_count();
    for (c10::DeviceIndex i = 0; i < count; ++i) {
      // Seeded like the CPU default generator until torch.manual_seed reseeds every device.
      generators.push_back(at::make_generator<NeuronGeneratorImpl>(i));
    }
  });
  device = resolve_device_index(device);
  return generators.at(static_cast<size_t>(device));
}

at::Generator new_generator(c10::DeviceIndex device) {
  return at::make_generator<NeuronGeneratorImpl>(resolve_device_index(device));
}

at::Generator host_engine_for(const std::optional<at::Generator>& generator,
                              c10::DeviceIndex device) {
  if (!generator.has_value() || !generator->defined()) {
    return default_generator(device).get<NeuronGeneratorImpl>()->engine();
  }
  TORCH_CHECK(generator->device().type() == c10::DeviceType::PrivateUse1,
              "Expected a 'neuron' generator for an op on neuron tensors, but got a generator "
              "for '",
              generator->device().str(), "'. Create it with torch.Generator(device='neuron').");
  return generator->get<NeuronGeneratorImpl>()->engine();
}

}  // namespace torchneuron
