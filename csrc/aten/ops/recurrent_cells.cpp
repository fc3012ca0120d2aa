// Recurrent cells: nn.RNNCell, nn.LSTMCell, nn.GRUCell (aten::rnn_tanh_cell, rnn_relu_cell,
// lstm_cell, gru_cell), and the cell step the sequence ops share.
//
// Why these ops have neuron kernels: PyTorch's composite implementation sends every device
// but the CPU to fused cell kernels (_thnn_fused_lstm_cell, _thnn_fused_gru_cell) that only
// CUDA implements. The kernels here compute each step exactly as the CPU path does (same ops,
// same order, biases added inside the matmuls), out of ATen ops on the neuron tensors, so
// results equal the CPU's bit for bit, autograd records the same graph as on the CPU
// (double backward included), and every op is counted like any other.
#include "ops/recurrent_cells.h"

#include <torch/library.h>

#include "op_registrations.h"
#include "ops/op_tracking.h"

namespace torchneuron::recurrent {

CellState CellState::rows(int64_t start, int64_t end) const {
  return {h.narrow(0, start, end - start), c.defined() ? c.narrow(0, start, end - start) : c};
}

CellState concat_rows(const std::vector<CellState>& states) {
  std::vector<at::Tensor> hs, cs;
  hs.reserve(states.size());
  cs.reserve(states.size());
  for (const CellState& s : states) {
    hs.push_back(s.h);
    if (s.c.defined()) cs.push_back(s.c);
  }
  return {at::cat(hs, 0), cs.empty() ? at::Tensor() : at::cat(cs, 0)};
}

namespace {

at::Tensor simple_step(CellKind kind, const at::Tensor& x, const at::Tensor& h,
                       const CellWeights& w, bool x_is_input_part) {
  at::Tensor pre_activation = w.hidden_part(h).add_(x_is_input_part ? x : w.input_part(x));
  return kind == CellKind::kTanh ? at::tanh(pre_activation) : at::relu(pre_activation);
}

CellState lstm_step(const at::Tensor& x, const CellState& state, const CellWeights& w,
                    bool x_is_input_part) {
  at::Tensor gates = w.hidden_part(state.h).add_(x_is_input_part ? x : w.input_part(x));
  std::vector<at::Tensor> chunks = gates.unsafe_chunk(4, 1);
  at::Tensor input_gate = chunks[0].sigmoid_();
  at::Tensor forget_gate = chunks[1].sigmoid_();
  at::Tensor cell_gate = chunks[2].tanh_();
  at::Tensor output_gate = chunks[3].sigmoid_();
  at::Tensor c = (forget_gate * state.c).add_(input_gate * cell_gate);
  at::Tensor h = output_gate * c.tanh();
  if (w.w_hr.defined()) h = at::matmul(h, w.w_hr.t());
  return {h, c};
}

at::Tensor gru_step(const at::Tensor& x, const at::Tensor& h, const CellWeights& w,
                    bool x_is_input_part) {
  std::vector<at::Tensor> x_gates = (x_is_input_part ? x : w.input_part(x)).unsafe_chunk(3, 1);
  std::vector<at::Tensor> h_gates = w.hidden_part(h).unsafe_chunk(3, 1);
  at::Tensor reset_gate = h_gates[0].add_(x_gates[0]).sigmoid_();
  at::Tensor update_gate = h_gates[1].add_(x_gates[1]).sigmoid_();
  at::Tensor candidate = x_gates[2].add(h_gates[2].mul_(reset_gate)).tanh_();
  return (h - candidate).mul_(update_gate).add_(candidate);
}

}  // namespace

CellState cell_step(CellKind kind, const at::Tensor& x, const CellState& state,
                    const CellWeights& weights, bool x_is_input_part) {
  switch (kind) {
    case CellKind::kLstm:
      return lstm_step(x, state, weights, x_is_input_part);
    case CellKind::kGru:
      return {gru_step(x, state.h, weights, x_is_input_part), at::Tensor()};
    case CellKind::kTanh:
    case CellKind::kRelu:
      break;
  }
  return {simple_step(kind, x, state.h, weights, x_is_input_part), at::Tensor()};
}

namespace {

// Shape checks with the CPU's messages (the CPU runs them in a different order per op).
void check_input_size(const at::Tensor& input, const at::Tensor& w_ih) {
  TORCH_CHECK(input.size(1) == w_ih.size(1), "input has inconsistent input_size: got ",
              input.size(1), " expected ", w_ih.size(1));
}

void check_hidden(const at::Tensor& input, const at::Tensor& hx, int64_t hidden_size, int label) {
  TORCH_CHECK(input.size(0) == hx.size(0), "Input batch size ", input.size(0),
              " doesn't match hidden", label, " batch size ", hx.size(0));
  TORCH_CHECK(hx.size(1) == hidden_size, "hidden", label, " has inconsistent hidden_size: got ",
              hx.size(1), ", expected ", hidden_size);
}

void check_gate_rows(const at::Tensor& w_ih, const at::Tensor& w_hh, int64_t gates) {
  const int64_t rows = gates * w_hh.size(1);
  TORCH_CHECK(w_ih.size(0) == rows, "weight_ih first dim must be ", gates,
              " * hidden_size = ", rows, ", but got ", w_ih.size(0));
  TORCH_CHECK(w_hh.size(0) == rows, "weight_hh first dim must be ", gates,
              " * hidden_size = ", rows, ", but got ", w_hh.size(0));
}

CellWeights cell_weights(const at::Tensor& w_ih, const at::Tensor& w_hh,
                         const std::optional<at::Tensor>& b_ih,
                         const std::optional<at::Tensor>& b_hh) {
  return {w_ih, w_hh, b_ih.value_or(at::Tensor()), b_hh.value_or(at::Tensor()), at::Tensor()};
}

void count(OpCounter& counter) { counter.executed.fetch_add(1, std::memory_order_relaxed); }

std::tuple<at::Tensor, at::Tensor> lstm_cell(const at::Tensor& input, at::TensorList hx,
                                             const at::Tensor& w_ih, const at::Tensor& w_hh,
                                             const std::optional<at::Tensor>& b_ih,
                                             const std::optional<at::Tensor>& b_hh) {
  static OpCounter& counter = op_counter_named("aten::lstm_cell");
  count(counter);
  TORCH_CHECK(hx.size() == 2, "lstm_cell expects two hidden states");
  const int64_t hidden_size = w_hh.size(1);
  check_input_size(input, w_ih);
  check_gate_rows(w_ih, w_hh, 4);
  check_hidden(input, hx[0], hidden_size, 0);
  check_hidden(input, hx[1], hidden_size, 1);
  CellState next = cell_step(CellKind::kLstm, input, {hx[0], hx[1]},
                             cell_weights(w_ih, w_hh, b_ih, b_hh), /*x_is_input_part=*/false);
  return {std::move(next.h), std::move(next.c)};
}

at::Tensor gru_cell(const at::Tensor& input, const at::Tensor& hx, const at::Tensor& w_ih,
                    const at::Tensor& w_hh, const std::optional<at::Tensor>& b_ih,
                    const std::optional<at::Tensor>& b_hh) {
  static OpCounter& counter = op_counter_named("aten::gru_cell");
  count(counter);
  check_input_size(input, w_ih);
  check_hidden(input, hx, w_hh.size(1), 0);
  check_gate_rows(w_ih, w_hh, 3);
  return cell_step(CellKind::kGru, input, {hx, at::Tensor()}, cell_weights(w_ih, w_hh, b_ih, b_hh),
                   /*x_is_input_part=*/false)
      .h;
}

template <CellKind kind>
at::Tensor simple_cell(const at::Tensor& input, const at::Tensor& hx, const at::Tensor& w_ih,
                       const at::Tensor& w_hh, const std::optional<at::Tensor>& b_ih,
                       const std::optional<at::Tensor>& b_hh) {
  static OpCounter& counter =
      op_counter_named(kind == CellKind::kTanh ? "aten::rnn_tanh_cell" : "aten::rnn_relu_cell");
  count(counter);
  check_gate_rows(w_ih, w_hh, 1);
  check_input_size(input, w_ih);
  check_hidden(input, hx, w_hh.size(1), 0);
  return cell_step(kind, input, {hx, at::Tensor()}, cell_weights(w_ih, w_hh, b_ih, b_hh),
                   /*x_is_input_part=*/false)
      .h;
}

}  // namespace

// Registered for the autograd key too (op_registrations.cpp): these ops are
// CompositeImplicitAutograd, and a backend kernel alone would leave autograd to PyTorch's
// decomposition (the fused path). Called at the autograd key, the ATen ops inside record the graph
// themselves.
void register_cells(torch::Library& m) {
  m.impl("lstm_cell", TORCH_FN(lstm_cell));
  m.impl("gru_cell", TORCH_FN(gru_cell));
  m.impl("rnn_tanh_cell", TORCH_FN(simple_cell<CellKind::kTanh>));
  m.impl("rnn_relu_cell", TORCH_FN(simple_cell<CellKind::kRelu>));
}

}  // namespace torchneuron::recurrent

namespace torchneuron {

void register_recurrent_cells(torch::Library& m) { recurrent::register_cells(m); }

}  // namespace torchneuron
