#pragma once
// Small layers: Dropout, activations as modules, and the SwiGLU MLP.
// # Shapes (all): x [..., D] -> [..., D] (SwiGLU: D -> hidden -> D)
#include <memory>

#include "kiln/nn/linear.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::nn {

// Dropout: in training, zeroes each element with probability p and scales the rest by 1/(1 − p),
// drawing from the thread's default generator (so a checkpointed run resumes identically); identity in eval.
template <Backend B> class Dropout : public Module<B> {
 public:
  explicit Dropout(double p = 0.5);
  Var<B> forward(const Var<B>& x) const;
  Var<B> operator()(const Var<B>& x) const { return forward(x); }

 private:
  double p_;
};

enum class Activation { relu, silu, gelu, gelu_tanh };

template <Backend B> class Act : public Module<B> {
 public:
  explicit Act(Activation a) : a_(a) {}
  Var<B> forward(const Var<B>& x) const;
  Var<B> operator()(const Var<B>& x) const { return forward(x); }

 private:
  Activation a_;
};

// The activations as PyTorch names them, for Sequential: nn::ReLU<B>(), nn::SiLU<B>(), nn::GELU<B>()
// (GELU<B>(true) is PyTorch's GELU(approximate="tanh")).
template <Backend B> class ReLU : public Act<B> {
 public:
  ReLU() : Act<B>(Activation::relu) {}
};
template <Backend B> class SiLU : public Act<B> {
 public:
  SiLU() : Act<B>(Activation::silu) {}
};
template <Backend B> class GELU : public Act<B> {
 public:
  explicit GELU(bool tanh_approx = false) : Act<B>(tanh_approx ? Activation::gelu_tanh : Activation::gelu) {}
};

struct SwiGLUOptions {
  int64_t dim = 0;
  int64_t hidden = 0;
  DType dtype = DType::f32;
};

namespace functional {
// silu(gate) ⊙ up as one recorded op on the fused kernel (core/fused_swiglu.hpp); backward saves gate and up.
template <Backend B> KILN_API Var<B> swiglu(const Var<B>& gate, const Var<B>& up);
}  // namespace functional

// down_proj(silu(gate_proj(x)) ⊙ up_proj(x)); parameters gate_proj, up_proj, down_proj (no biases).
template <Backend B> class SwiGLU : public Module<B> {
 public:
  explicit SwiGLU(SwiGLUOptions o);
  Var<B> forward(const Var<B>& x) const;
  Var<B> operator()(const Var<B>& x) const { return forward(x); }

 private:
  std::shared_ptr<Linear<B>> gate_, up_, down_;
};

#define KILN_EXTERN(B)              \
  extern template class Dropout<B>; \
  extern template class Act<B>;     \
  extern template class SwiGLU<B>;  \
  extern template Var<B> functional::swiglu<B>(const Var<B>&, const Var<B>&);
KILN_FOR_EACH_BACKEND(KILN_EXTERN)
#undef KILN_EXTERN

}  // namespace kiln::nn
#pragma GCC visibility pop
