// The per-device random generator. Each neuron generator owns a CPU (mt19937 + normal
// cache) engine: random kernels run on the host over device memory, so they draw from that
// engine, and its state is what get_rng_state/set_rng_state save and restore exactly.
#pragma once

#include <ATen/core/Generator.h>

#include <optional>

namespace torchneuron {

class NeuronGeneratorImpl final : public c10::GeneratorImpl {
 public:
  explicit NeuronGeneratorImpl(c10::DeviceIndex device, uint64_t seed = c10::default_rng_seed_val);

  void set_current_seed(uint64_t seed) override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_state(const c10::TensorImpl& new_state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;

  // The host engine that kernels of this device draw from.
  const at::Generator& engine() const { return engine_; }
  static c10::DeviceType device_type() { return c10::DeviceType::PrivateUse1; }

 private:
  NeuronGeneratorImpl* clone_impl() const override;
  at::Generator engine_;
};

const at::Generator& default_generator(c10::DeviceIndex device);
at::Generator new_generator(c10::DeviceIndex device);
// The engine a host kernel should use for an op on `device` given the op's generator
// argument (none means the device's default generator).
at::Generator host_engine_for(const std::optional<at::Generator>& generator,
                              c10::DeviceIndex device);

}  // namespace torchneuron
