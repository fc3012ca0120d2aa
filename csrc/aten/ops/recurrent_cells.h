// One step of a recurrent cell, computed with the same ATen ops in the same order as
// PyTorch's CPU path (aten/src/ATen/native/RNN.cpp), so that neuron results equal the CPU's
// bit for bit. Shared by the cell ops (recurrent_cells.cpp) and the sequence ops
// (recurrent_layers.cpp).
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace torchneuron::recurrent {

enum class CellKind { kTanh, kRelu, kLstm, kGru };

// The weights of one layer and direction. Biases and the LSTM projection may be undefined.
struct CellWeights {
  at::Tensor w_ih, w_hh, b_ih, b_hh, w_hr;

  at::Tensor input_part(const at::Tensor& x) const { return at::linear(x, w_ih, b_ih); }
  at::Tensor hidden_part(const at::Tensor& h) const { return at::linear(h, w_hh, b_hh); }
};

// Hidden state: `h` (the cell's output), and `c` for an LSTM (undefined otherwise).
struct CellState {
  at::Tensor h, c;

  // Rows [start, end) of the batch.
  CellState rows(int64_t start, int64_t end) const;
};

// Concatenates states along the batch dimension, in order.
CellState concat_rows(const std::vector<CellState>& states);

// One step. With `x_is_input_part`, `x` already holds input_part(x) (the sequence ops compute
// it for all steps at once, as the CPU does).
CellState cell_step(CellKind kind, const at::Tensor& x, const CellState& state,
                    const CellWeights& weights, bool x_is_input_part);

}  // namespace torchneuron::recurrent
