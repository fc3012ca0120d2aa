// Recurrent sequence ops: nn.RNN (tanh, relu), nn.LSTM and nn.GRU, i.e. aten::rnn_tanh,
// rnn_relu, lstm and gru, each over padded input (.input) and packed sequences (.data).
//
// Why these ops have neuron kernels: PyTorch's composite implementation (RNN.cpp) gives every
// device but the CPU another algorithm: no whole-sequence input projection, and fused cells
// (_thnn_fused_*_cell) that only CUDA implements. These kernels follow the CPU's algorithm
// with the same ATen ops in the same order, so neuron results equal the CPU's bit for bit:
//  - a layer's input projection is one linear over the whole sequence, then one cell step
//    (recurrent_cells.cpp) per time step; packed sequences shrink and regrow the batch as the
//    CPU does;
//  - an LSTM over padded float32/bfloat16 input (float16 without grad) without projections
//    runs one aten::mkldnn_rnn_layer per layer and direction when oneDNN is enabled, as the
//    CPU does (but under bf16 autocast on hosts where oneDNN has no bf16 LSTM, where the
//    CPU raises): its CPU kernel runs over device memory like every other op, and its
//    derivatives.yaml entry gives backward (and double backward) as on the CPU;
//  - dropout between layers uses the CPU's formula (bernoulli_ noise, divided by 1 - p),
//    drawn from the device generator, so equal seeds give equal masks.
// The kernels are registered for the autograd key as well as the backend key: the ATen ops
// inside record the autograd graph themselves, exactly as the CPU's composite does.
#include <ATen/Config.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/RNN.h>
#include <ATen/ops/mkldnn_rnn_layer.h>
#include <torch/library.h>

#include <algorithm>

#include "op_registrations.h"
#include "ops/op_tracking.h"
#include "ops/recurrent_cells.h"

namespace torchneuron::recurrent {
namespace {

void count(OpCounter& counter) { counter.executed.fetch_add(1, std::memory_order_relaxed); }

// A layer's input: a padded [steps, batch, features] tensor, or the data of a packed
// sequence with its batch sizes (host memory, one per step, non-increasing).
struct Sequence {
  at::Tensor data;
  const int64_t* batch_sizes = nullptr;
  int64_t steps = 0;

  bool packed() const { return batch_sizes != nullptr; }
};

Sequence packed_sequence(const at::Tensor& data, const at::Tensor& batch_sizes) {
  TORCH_CHECK(batch_sizes.device().is_cpu(),
              "the batch_sizes of a packed sequence must be a CPU tensor (as "
              "pack_padded_sequence makes them), but got one on ",
              batch_sizes.device());
  TORCH_CHECK(batch_sizes.dim() == 1 && batch_sizes.size(0) > 0,
              "the batch_sizes of a packed sequence must be a non-empty 1-D tensor, but got "
              "shape ",
              batch_sizes.sizes());
  TORCH_CHECK(batch_sizes.is_contiguous(),
              "the batch_sizes of a packed sequence must be contiguous");
  return {data, batch_sizes.data_ptr<int64_t>(), batch_sizes.size(0)};
}

struct DirectionResult {
  at::Tensor output;
  CellState final_state;
};

// One direction over padded input; `reverse` walks the steps backwards.
DirectionResult run_padded(CellKind kind, const at::Tensor& input, const CellState& initial,
                           const CellWeights& w, bool reverse) {
  std::vector<at::Tensor> steps = w.input_part(input).unbind(0);
  if (reverse) std::reverse(steps.begin(), steps.end());
  std::vector<at::Tensor> outputs;
  outputs.reserve(steps.size());
  CellState state = initial;
  for (const at::Tensor& x : steps) {
    state = cell_step(kind, x, state, w, /*x_is_input_part=*/true);
    outputs.push_back(state.h);
  }
  TORCH_CHECK(!outputs.empty(), "Expected sequence length to be larger than 0 in RNN");
  if (reverse) std::reverse(outputs.begin(), outputs.end());
  return {at::stack(outputs, 0), state};
}

// Forward over a packed sequence: when the batch shrinks, the rows of sequences that ended
// are set aside as their final states.
DirectionResult run_packed_forward(CellKind kind, const Sequence& input, const CellState& initial,
                                   const CellWeights& w) {
  const at::Tensor projected = w.input_part(input.data);
  std::vector<at::Tensor> outputs;
  outputs.reserve(input.steps);
  std::vector<CellState> finished;
  CellState state = initial;
  int64_t offset = 0;
  int64_t previous = input.batch_sizes[0];
  for (int64_t i = 0; i < input.steps; ++i) {
    const int64_t batch = input.batch_sizes[i];
    const at::Tensor x = projected.narrow(0, offset, batch);
    offset += batch;
    if (batch < previous) {
      finished.push_back(state.rows(batch, previous));
      state = state.rows(0, batch);
    }
    previous = batch;
    state = cell_step(kind, x, state, w, /*x_is_input_part=*/true);
    outputs.push_back(state.h);
  }
  finished.push_back(state);
  std::reverse(finished.begin(), finished.end());
  return {at::cat(outputs, 0), concat_rows(finished)};
}

// Backward over a packed sequence: starts with the shortest batch and adds the initial
// states of longer sequences as they begin.
DirectionResult run_packed_reverse(CellKind kind, const Sequence& input, const CellState& initial,
                                   const CellWeights& w) {
  const at::Tensor projected = w.input_part(input.data);
  std::vector<at::Tensor> outputs;
  outputs.reserve(input.steps);
  int64_t offset = input.data.size(0);
  int64_t previous = input.batch_sizes[input.steps - 1];
  CellState state = initial.rows(0, previous);
  for (int64_t i = input.steps - 1; i >= 0; --i) {
    const int64_t batch = input.batch_sizes[i];
    if (batch > previous) state = concat_rows({state, initial.rows(previous, batch)});
    const at::Tensor x = projected.narrow(0, offset - batch, batch);
    offset -= batch;
    previous = batch;
    state = cell_step(kind, x, state, w, /*x_is_input_part=*/true);
    outputs.push_back(state.h);
  }
  std::reverse(outputs.begin(), outputs.end());
  return {at::cat(outputs, 0), state};
}

struct StackResult {
  at::Tensor output;
  std::vector<CellState> final_states;  // layer-major, then direction
};

// The CPU's dropout (not native_dropout): noise = bernoulli_(1 - p) / (1 - p); input * noise.
at::Tensor dropout_between_layers(const at::Tensor& input, double p) {
  TORCH_CHECK(p >= 0 && p <= 1, "dropout probability has to be between 0 and 1, but got ", p);
  if (p == 0 || input.numel() == 0) return input;
  if (p == 1) return input.mul(at::zeros({}, input.options()));
  at::Tensor noise = at::empty_like(input);
  noise.bernoulli_(1 - p);
  noise.div_(1 - p);
  return input.mul(noise);
}

StackResult run_stack(CellKind kind, Sequence input, const std::vector<CellWeights>& weights,
                      const std::vector<CellState>& states, int64_t num_layers, double dropout_p,
                      bool train, bool bidirectional) {
  const size_t directions = bidirectional ? 2 : 1;
  if (bidirectional) {
    TORCH_CHECK(states.size() % 2 == 0 && weights.size() % 2 == 0,
                "Odd number of params or hiddens given to a bidirectional RNN");
  }
  TORCH_CHECK(num_layers == static_cast<int64_t>(states.size() / directions),
              "Expected more hidden states in stacked_rnn");
  TORCH_CHECK(num_layers == static_cast<int64_t>(weights.size() / directions),
              "Expected more weights in stacked_rnn");
  std::vector<CellState> final_states;
  final_states.reserve(states.size());
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    const size_t first = static_cast<size_t>(layer) * directions;
    DirectionResult forward =
        input.packed() ? run_packed_forward(kind, input, states[first], weights[first])
                       : run_padded(kind, input.data, states[first], weights[first], false);
    final_states.push_back(forward.final_state);
    if (bidirectional) {
      DirectionResult backward =
          input.packed()
              ? run_packed_reverse(kind, input, states[first + 1], weights[first + 1])
              : run_padded(kind, input.data, states[first + 1], weights[first + 1], true);
      final_states.push_back(backward.final_state);
      const int64_t feature_dim = input.packed() ? -1 : forward.output.dim() - 1;
      input.data = at::cat({forward.output, backward.output}, feature_dim);
    } else {
      input.data = forward.output;
    }
    if (dropout_p != 0 && train && layer < num_layers - 1) {
      input.data = dropout_between_layers(input.data, dropout_p);
    }
  }
  return {input.data, std::move(final_states)};
}

// nn.RNNBase's flat weights: per layer and direction w_ih, w_hh[, b_ih, b_hh][, w_hr].
std::vector<CellWeights> gather_weights(at::TensorList params, bool has_biases,
                                        bool has_projections) {
  const size_t per_cell = (has_biases ? 4 : 2) + (has_projections ? 1 : 0);
  TORCH_CHECK(params.size() % per_cell == 0, "got an incorrect number of RNN parameters");
  std::vector<CellWeights> result;
  result.reserve(params.size() / per_cell);
  for (size_t i = 0; i < params.size(); i += per_cell) {
    CellWeights w{params[i], params[i + 1], at::Tensor(), at::Tensor(), at::Tensor()};
    if (has_biases) {
      w.b_ih = params[i + 2];
      w.b_hh = params[i + 3];
    }
    if (has_projections) w.w_hr = params[i + per_cell - 1];
    result.push_back(std::move(w));
  }
  return result;
}

std::vector<CellState> single_states(const at::Tensor& hx) {
  std::vector<CellState> states;
  for (at::Tensor& h : hx.unbind(0)) states.push_back({std::move(h), at::Tensor()});
  return states;
}

std::vector<CellState> lstm_states(const at::Tensor& hx, const at::Tensor& cx) {
  std::vector<at::Tensor> hs = hx.unbind(0);
  std::vector<at::Tensor> cs = cx.unbind(0);
  TORCH_CHECK(hs.size() == cs.size(), "lstm: h_0 and c_0 must have the same number of layers, ",
              "but got ", hs.size(), " and ", cs.size());
  std::vector<CellState> states;
  for (size_t i = 0; i < hs.size(); ++i) states.push_back({hs[i], cs[i]});
  return states;
}

at::Tensor stack_h(const std::vector<CellState>& states) {
  std::vector<at::Tensor> hs;
  for (const CellState& s : states) hs.push_back(s.h);
  return at::stack(hs, 0);
}

at::Tensor stack_c(const std::vector<CellState>& states) {
  std::vector<at::Tensor> cs;
  for (const CellState& s : states) cs.push_back(s.c);
  return at::stack(cs, 0);
}

// ---- LSTM through oneDNN, where the CPU takes that path ----

// ideep::rnn_kind::LSTM, the mode argument of aten::mkldnn_rnn_layer.
constexpr int64_t kOnednnLstmMode = 2;

bool onednn_query(const char* op) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(op, "").typed<bool()>().call();
}

// The CPU's choice (use_mkldnn in RNN.cpp), with "every tensor on the CPU" read as "every
// tensor on the input's device"; tensors elsewhere take the other path, which reports them.
bool cpu_uses_onednn(const at::Tensor& input, at::TensorList params, at::TensorList hx) {
#if !AT_MKLDNN_ENABLED()
  return false;
#endif
  if (!at::globalContext().userEnabledMkldnn()) return false;
  const auto on_input_device = [&](at::TensorList tensors) {
    return std::all_of(tensors.begin(), tensors.end(), [&](const at::Tensor& t) {
      return t.defined() && t.device() == input.device() && t.layout() == at::kStrided;
    });
  };
  if (input.layout() != at::kStrided || !on_input_device(params) || !on_input_device(hx)) {
    return false;
  }
  static const bool bf16 = onednn_query("mkldnn::_is_mkldnn_bf16_supported");
  static const bool fp16 = onednn_query("mkldnn::_is_mkldnn_fp16_supported");
  // Under autocast, mkldnn_rnn_layer is cast to bf16 whatever the input's dtype, and oneDNN
  // has no bf16 LSTM below AVX-512: the CPU raises "could not create a primitive descriptor"
  // there. neuron takes the other path instead, as the CPU does with oneDNN off.
  if (!bf16 && at::autocast::is_autocast_enabled(input.device().type()) &&
      at::autocast::get_autocast_dtype(input.device().type()) == at::kBFloat16) {
    return false;
  }
  const at::ScalarType dtype = input.scalar_type();
  const bool dtype_ok = dtype == at::kFloat || (dtype == at::kBFloat16 && bf16) ||
                        (dtype == at::kHalf && !at::GradMode::is_enabled() && fp16);
  return dtype_ok && input.numel() != 0;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> onednn_lstm(const at::Tensor& input,
                                                           at::TensorList hx, at::TensorList params,
                                                           bool has_biases, int64_t num_layers,
                                                           double dropout_p, bool train,
                                                           bool bidirectional, bool batch_first) {
  at::Tensor layer_input = (batch_first ? input.transpose(0, 1) : input).contiguous();
  const at::Tensor h0 = hx[0].contiguous();
  const at::Tensor c0 = hx[1].contiguous();
  const int64_t hidden_size = h0.size(2);
  const size_t per_cell = has_biases ? 4 : 2;
  const int64_t directions = bidirectional ? 2 : 1;
  TORCH_CHECK(params.size() % per_cell == 0 &&
                  params.size() >= per_cell * static_cast<size_t>(num_layers * directions),
              "got an incorrect number of RNN parameters");
  std::vector<at::Tensor> outputs(directions), hy, cy;
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    for (int64_t direction = 0; direction < directions; ++direction) {
      const int64_t index = layer * directions + direction;
      const at::TensorList w = params.slice(index * per_cell, per_cell);
      // Without biases the CPU passes zero tensors that the kernel ignores.
      const at::Tensor b_ih = has_biases ? w[2] : at::zeros(w[0].sizes(), w[0].options());
      const at::Tensor b_hh = has_biases ? w[3] : at::zeros(w[1].sizes(), w[1].options());
      auto result = at::mkldnn_rnn_layer(layer_input, w[0], w[1], b_ih, b_hh, h0[index], c0[index],
                                         /*reverse=*/direction > 0,
                                         /*batch_sizes=*/{}, kOnednnLstmMode, hidden_size,
                                         num_layers, has_biases, bidirectional, batch_first, train);
      outputs[direction] = std::get<0>(result);
      hy.push_back(std::get<1>(result));
      cy.push_back(std::get<2>(result));
    }
    layer_input = directions == 1 ? outputs[0] : at::cat(outputs, -1);
    if (dropout_p != 0 && train && layer < num_layers - 1) {
      layer_input = dropout_between_layers(layer_input, dropout_p);
    }
  }
  at::Tensor output = batch_first ? layer_input.transpose(0, 1) : layer_input;
  return {output, at::stack(hy, 0), at::stack(cy, 0)};
}

// ---- The ops ----

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_padded(const at::Tensor& input,
                                                           at::TensorList hx, at::TensorList params,
                                                           bool has_biases, int64_t num_layers,
                                                           double dropout_p, bool train,
                                                           bool bidirectional, bool batch_first) {
  static OpCounter& counter = op_counter_named("aten::lstm.input");
  count(counter);
  TORCH_CHECK(hx.size() == 2, "lstm expects two hidden states");
  const bool has_projections = hx[0].size(2) != hx[1].size(2);
  if (!has_projections && cpu_uses_onednn(input, params, hx)) {
    return onednn_lstm(input, hx, params, has_biases, num_layers, dropout_p, train, bidirectional,
                       batch_first);
  }
  at::native::check_attributes(input, params, hx);
  StackResult result =
      run_stack(CellKind::kLstm, Sequence{batch_first ? input.transpose(0, 1) : input},
                gather_weights(params, has_biases, has_projections), lstm_states(hx[0], hx[1]),
                num_layers, dropout_p, train, bidirectional);
  at::Tensor output = batch_first ? result.output.transpose(0, 1) : result.output;
  return {output, stack_h(result.final_states), stack_c(result.final_states)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstm_packed(
    const at::Tensor& data, const at::Tensor& batch_sizes, at::TensorList hx, at::TensorList params,
    bool has_biases, int64_t num_layers, double dropout_p, bool train, bool bidirectional) {
  static OpCounter& counter = op_counter_named("aten::lstm.data");
  count(counter);
  TORCH_CHECK(hx.size() == 2, "lstm expects two hidden states");
  const bool has_projections = hx[0].size(2) != hx[1].size(2);
  StackResult result =
      run_stack(CellKind::kLstm, packed_sequence(data, batch_sizes),
                gather_weights(params, has_biases, has_projections), lstm_states(hx[0], hx[1]),
                num_layers, dropout_p, train, bidirectional);
  return {result.output, stack_h(result.final_states), stack_c(result.final_states)};
}

constexpr const char* op_name(CellKind kind, bool packed) {
  switch (kind) {
    case CellKind::kTanh:
      return packed ? "aten::rnn_tanh.data" : "aten::rnn_tanh.input";
    case CellKind::kRelu:
      return packed ? "aten::rnn_relu.data" : "aten::rnn_relu.input";
    case CellKind::kGru:
      return packed ? "aten::gru.data" : "aten::gru.input";
    case CellKind::kLstm:
      break;
  }
  return packed ? "aten::lstm.data" : "aten::lstm.input";
}

// rnn_tanh, rnn_relu and gru: one hidden state per layer and direction.
template <CellKind kind>
std::tuple<at::Tensor, at::Tensor> one_state_padded(const at::Tensor& input, const at::Tensor& hx,
                                                    at::TensorList params, bool has_biases,
                                                    int64_t num_layers, double dropout_p,
                                                    bool train, bool bidirectional,
                                                    bool batch_first) {
  static OpCounter& counter = op_counter_named(op_name(kind, /*packed=*/false));
  count(counter);
  at::native::check_attributes(input, params, {hx});
  StackResult result = run_stack(kind, Sequence{batch_first ? input.transpose(0, 1) : input},
                                 gather_weights(params, has_biases, false), single_states(hx),
                                 num_layers, dropout_p, train, bidirectional);
  // The CPU transposes its output in place; so do we (autograd sees the same graph).
  if (batch_first) result.output.transpose_(0, 1);
  return {result.output, stack_h(result.final_states)};
}

template <CellKind kind>
std::tuple<at::Tensor, at::Tensor> one_state_packed(const at::Tensor& data,
                                                    const at::Tensor& batch_sizes,
                                                    const at::Tensor& hx, at::TensorList params,
                                                    bool has_biases, int64_t num_layers,
                                                    double dropout_p, bool train,
                                                    bool bidirectional) {
  static OpCounter& counter = op_counter_named(op_name(kind, /*packed=*/true));
  count(counter);
  StackResult result =
      run_stack(kind, packed_sequence(data, batch_sizes), gather_weights(params, has_biases, false),
                single_states(hx), num_layers, dropout_p, train, bidirectional);
  return {result.output, stack_h(result.final_states)};
}

}  // namespace

// Registered for both keys (op_registrations.cpp): see the note at the top.
void register_sequence_ops(torch::Library& m) {
  m.impl("lstm.input", TORCH_FN(lstm_padded));
  m.impl("lstm.data", TORCH_FN(lstm_packed));
  m.impl("gru.input", TORCH_FN(one_state_padded<CellKind::kGru>));
  m.impl("gru.data", TORCH_FN(one_state_packed<CellKind::kGru>));
  m.impl("rnn_tanh.input", TORCH_FN(one_state_padded<CellKind::kTanh>));
  m.impl("rnn_tanh.data", TORCH_FN(one_state_packed<CellKind::kTanh>));
  m.impl("rnn_relu.input", TORCH_FN(one_state_padded<CellKind::kRelu>));
  m.impl("rnn_relu.data", TORCH_FN(one_state_packed<CellKind::kRelu>));
}

}  // namespace torchneuron::recurrent

namespace torchneuron {

void register_recurrent_layers(torch::Library& m) { recurrent::register_sequence_ops(m); }

}  // namespace torchneuron
