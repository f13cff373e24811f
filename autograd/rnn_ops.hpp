#pragma once
// Recurrent ops (autograd/ops/rnn.cpp; used by nn/rnn.hpp), in a header of their own so that the
// recurrent layers do not rebuild every op's users.
//   lstm_cell: one step's pointwise part, gates [N, 4H] (i, f, g, o pre-activations), c [N, H] -> [h' | c'] [N, 2H]
//   gru_cell:  one step's pointwise part, gi = x W_ihᵀ + b_ih, gh = h W_hhᵀ + b_hh [N, 3H] (r, z, n), h [N, H] -> h'
//   lstm_scan / gru_scan: one layer in one direction over all T steps as ONE record (the recurrence's
//     GEMMs and cells, forward and backpropagation through time), as cuDNN's and PyTorch's fused RNNs.
//     gi [T, N, G·H] is the input-to-hidden product with its biases (for the LSTM also b_hh), computed
//     by the caller in one GEMM; w_hh [G·H, P]; the LSTM's optional projection w_hr [P, H]; the GRU's
//     optional b_hh [3H]; h0 [N, P], c0 [N, H]; lengths: undefined, or i64 [N, 1] (sequence n runs
//     over steps t < lengths[n]; later outputs are 0 and its state is carried unchanged); reverse runs
//     t = T−1 … 0. Result: out [T, N, P], h_n [N, P], c_n [N, H] (undefined for the GRU), views of one
//     recorded tensor. Saving per step what the backward needs (activated gates, states), so the
//     backward is one pass over the steps plus one GEMM per weight.
#include "kiln/autograd/var.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::autograd {

template <Backend B> struct RnnOps {
  using X = Var<B>;
  static X lstm_cell(const X& gates, const X& c);
  static X gru_cell(const X& gi, const X& gh, const X& h);
  struct Scan {
    X out, h_n, c_n;
  };
  static Scan lstm_scan(const X& gi, const X& w_hh, const X& w_hr, const X& h0, const X& c0, const Tensor<B>& lengths, bool reverse);
  static Scan gru_scan(const X& gi, const X& w_hh, const X& b_hh, const X& h0, const Tensor<B>& lengths, bool reverse);
};

#define KILN_AUTOGRAD_RNN_EXTERN(B) extern template struct RnnOps<B>;
KILN_FOR_EACH_BACKEND(KILN_AUTOGRAD_RNN_EXTERN)
#undef KILN_AUTOGRAD_RNN_EXTERN

}  // namespace kiln::autograd
#pragma GCC visibility pop
