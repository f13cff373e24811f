#pragma once
// The hyper-parameters of one fused Adam/AdamW step (core/fused_optim.hpp), in a header of their own
// so backend declarations can name them without the Tensor header.
#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::fused {

struct AdamHyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool decoupled = true;
  double bc1 = 1, bc2_sqrt = 1;  // 1 − β1^t and √(1 − β2^t)
};

}  // namespace kiln::fused
#pragma GCC visibility pop
