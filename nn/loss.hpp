#pragma once
// Losses.
// cross_entropy: logits [N, C] (or [..., C]), targets integer [N] (or [...]) in [0, C) or ignore_index.
//   loss_i = (1 − ε)·(−log p_i[t_i]) + ε·mean_c(−log p_i[c]); mean over the non-ignored rows
//   (PyTorch semantics, label_smoothing ε; all rows ignored gives nan, as in PyTorch).
// mse: mean((a − b)²) with broadcasting.
#include "kiln/autograd/var.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::nn {

struct CrossEntropyOptions {
  int64_t ignore_index = -100;
  double label_smoothing = 0.0;
};

template <Backend B> KILN_API Var<B> cross_entropy(const Var<B>& logits, const Tensor<B>& targets, CrossEntropyOptions o = {});
template <Backend B> KILN_API Var<B> mse_loss(const Var<B>& a, const Var<B>& b);

}  // namespace kiln::nn
#pragma GCC visibility pop
