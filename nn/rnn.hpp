#pragma once
// Recurrent layers with torch.nn's semantics and parameter names: LSTM, GRU, LSTMCell, GRUCell.
//
// # Shapes (L = num_layers, D = 2 if bidirectional else 1, H = hidden_size, P = proj_size or H)
//   x [T, N, I] ([N, T, I] with batch_first, [T, I] unbatched)  ->  output [T, N, D·P] (same layout)
//   h0 / h_n [L·D, N, P] and c0 / c_n [L·D, N, H] (never batch-first; [L·D, P] unbatched); zeros if not given
// # Parameters, per layer k and direction (suffix "_reverse" for the backward one), in PyTorch's order
//   weight_ih_l{k} [G·H, I_k], weight_hh_l{k} [G·H, P], bias_ih_l{k} [G·H], bias_hh_l{k} [G·H],
//   weight_hr_l{k} [P, H] (LSTM with proj_size > 0); G = 4 (LSTM gates i, f, g, o) or 3 (GRU r, z, n);
//   I_0 = input_size, I_k = D·P. All drawn from U(−1/√H, 1/√H) as PyTorch.
// # Cells (gates = x W_ihᵀ + b_ih + h W_hhᵀ + b_hh, split in G chunks of H)
//   LSTM: c' = σ(f)·c + σ(i)·tanh(g),  h' = σ(o)·tanh(c')  (then h' W_hrᵀ with a projection)
//   GRU:  r = σ(r), z = σ(z), n = tanh(x W_inᵀ + b_in + r·(h W_hnᵀ + b_hn)),  h' = (1 − z)·n + z·h
// The input-to-hidden product of a layer is one GEMM over all T·N rows; the recurrence (one
// [N, P] × [P, G·H] GEMM per step and the cell's pointwise part) is one autograd record per layer and
// direction (autograd::RnnOps::lstm_scan / gru_scan, autograd/ops/rnn.cpp) whose backward walks the
// steps once and computes each weight's gradient as one GEMM over all steps. The cells' pointwise part
// is one record per step (functional::lstm_cell / gru_cell).
//
// Padded batches: forward(x, state, lengths) with lengths[n] in [1, T] runs sequence n over its first
// lengths[n] steps only, as PyTorch's pack_padded_sequence → LSTM → pad_packed_sequence: outputs past a
// sequence's end are zero, h_n / c_n are its state at its last step, and the reverse direction starts at
// its last step. `dropout` (training only) is applied to every layer's output but the last, as PyTorch
// (with num_layers = 1 it does nothing, where PyTorch also warns).
#include <optional>
#include <vector>

#include "kiln/nn/module.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::nn {

struct LSTMOptions {
  int64_t input_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 1;
  bool bias = true;
  bool batch_first = false;
  double dropout = 0.0;
  bool bidirectional = false;
  int64_t proj_size = 0;  // 0: no projection
  DType dtype = DType::f32;
};

struct GRUOptions {
  int64_t input_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 1;
  bool bias = true;
  bool batch_first = false;
  double dropout = 0.0;
  bool bidirectional = false;
  DType dtype = DType::f32;
};

struct RNNCellOptions {
  int64_t input_size = 0;
  int64_t hidden_size = 0;
  bool bias = true;
  DType dtype = DType::f32;
};

// (h, c): an LSTM's state, [L·D, N, P] and [L·D, N, H] for the layer, [N, H] for the cell.
template <Backend B> struct LSTMState { Var<B> h, c; };

// forward's result: auto [output, h_n, c_n] = lstm(x);
template <Backend B> struct LSTMOutput { Var<B> output, h_n, c_n; };
template <Backend B> struct GRUOutput { Var<B> output, h_n; };

namespace functional {
// The pointwise part of one LSTM step as one autograd record: gates [N, 4H] (pre-activation, both
// products and biases added), c [N, H] -> (h' = σ(o)·tanh(c'), c'). Saves the activated gates, c and tanh c'.
template <Backend B> KILN_API LSTMState<B> lstm_cell(const Var<B>& gates, const Var<B>& c);
// The pointwise part of one GRU step: gi = x W_ihᵀ + b_ih [N, 3H], gh = h W_hhᵀ + b_hh [N, 3H], h [N, H] -> h'.
template <Backend B> KILN_API Var<B> gru_cell(const Var<B>& gi, const Var<B>& gh, const Var<B>& h);
}  // namespace functional

template <Backend B> class LSTM : public Module<B> {
 public:
  explicit LSTM(LSTMOptions o);
  // lengths: empty (every sequence has T steps) or one length in [1, T] per batch element.
  LSTMOutput<B> forward(const Var<B>& x, const std::optional<LSTMState<B>>& state = std::nullopt,
                        const std::vector<int64_t>& lengths = {}) const;
  LSTMOutput<B> operator()(const Var<B>& x, const std::optional<LSTMState<B>>& state = std::nullopt,
                           const std::vector<int64_t>& lengths = {}) const {
    return forward(x, state, lengths);
  }
  const LSTMOptions& options() const { return o_; }

 private:
  LSTMOptions o_;
  std::vector<std::vector<Var<B>>> w_;  // per layer·direction: w_ih, w_hh, b_ih, b_hh, w_hr (undefined when absent)
};

template <Backend B> class GRU : public Module<B> {
 public:
  explicit GRU(GRUOptions o);
  GRUOutput<B> forward(const Var<B>& x, const std::optional<Var<B>>& h0 = std::nullopt, const std::vector<int64_t>& lengths = {}) const;
  GRUOutput<B> operator()(const Var<B>& x, const std::optional<Var<B>>& h0 = std::nullopt, const std::vector<int64_t>& lengths = {}) const {
    return forward(x, h0, lengths);
  }
  const GRUOptions& options() const { return o_; }

 private:
  GRUOptions o_;
  std::vector<std::vector<Var<B>>> w_;
};

// One step: x [N, I] or [I]; state [N, H] (or [H]) each, zeros if not given. Parameters weight_ih,
// weight_hh, bias_ih, bias_hh.
template <Backend B> class LSTMCell : public Module<B> {
 public:
  explicit LSTMCell(RNNCellOptions o);
  LSTMState<B> forward(const Var<B>& x, const std::optional<LSTMState<B>>& state = std::nullopt) const;
  LSTMState<B> operator()(const Var<B>& x, const std::optional<LSTMState<B>>& state = std::nullopt) const { return forward(x, state); }

 private:
  RNNCellOptions o_;
  Var<B> w_ih_, w_hh_, b_ih_, b_hh_;
};

template <Backend B> class GRUCell : public Module<B> {
 public:
  explicit GRUCell(RNNCellOptions o);
  Var<B> forward(const Var<B>& x, const std::optional<Var<B>>& h = std::nullopt) const;
  Var<B> operator()(const Var<B>& x, const std::optional<Var<B>>& h = std::nullopt) const { return forward(x, h); }

 private:
  RNNCellOptions o_;
  Var<B> w_ih_, w_hh_, b_ih_, b_hh_;
};

#define KILN_RNN_EXTERN(B)                                                             \
  extern template class LSTM<B>;                                                       \
  extern template class GRU<B>;                                                        \
  extern template class LSTMCell<B>;                                                   \
  extern template class GRUCell<B>;                                                    \
  extern template LSTMState<B> functional::lstm_cell<B>(const Var<B>&, const Var<B>&); \
  extern template Var<B> functional::gru_cell<B>(const Var<B>&, const Var<B>&, const Var<B>&);
KILN_FOR_EACH_BACKEND(KILN_RNN_EXTERN)
#undef KILN_RNN_EXTERN

}  // namespace kiln::nn
#pragma GCC visibility pop
