#include "kiln/nn/layers.hpp"

#include "kiln/autograd/layer_ops.hpp"

namespace kiln::nn {

template <Backend B> Var<B> functional::swiglu(const Var<B>& gate, const Var<B>& up) { return autograd::SwiGLUOps<B>::swiglu(gate, up); }

template <Backend B> Dropout<B>::Dropout(double p) : p_(p) { KILN_CHECK(p >= 0 && p < 1, "Dropout: p must be in [0, 1), got {}", p); }

template <Backend B> Var<B> Dropout<B>::forward(const Var<B>& x) const {
  if (!this->is_training() || p_ == 0) return x;
  const Tensor<B> keep = Tensor<B>::rand(x.shape(), DType::f32).ge(p_).to(x.dtype()).mul(1.0 / (1.0 - p_));
  return x * Var<B>(keep);
}

template <Backend B> Var<B> Act<B>::forward(const Var<B>& x) const {
  switch (a_) {
    case Activation::relu:
      return x.relu();
    case Activation::silu:
      return x.silu();
    case Activation::gelu:
      return x.gelu(false);
    case Activation::gelu_tanh:
      return x.gelu(true);
  }
  return x;
}

template <Backend B> SwiGLU<B>::SwiGLU(SwiGLUOptions o) {
  gate_ = this->register_module("gate_proj",
                                std::make_shared<Linear<B>>(LinearOptions{.in = o.dim, .out = o.hidden, .bias = false, .dtype = o.dtype}));
  up_ = this->register_module("up_proj",
                              std::make_shared<Linear<B>>(LinearOptions{.in = o.dim, .out = o.hidden, .bias = false, .dtype = o.dtype}));
  down_ = this->register_module("down_proj",
                                std::make_shared<Linear<B>>(LinearOptions{.in = o.hidden, .out = o.dim, .bias = false, .dtype = o.dtype}));
}

template <Backend B> Var<B> SwiGLU<B>::forward(const Var<B>& x) const {
  return down_->forward(functional::swiglu(gate_->forward(x), up_->forward(x)));
}

#define KILN_INST(B)         \
  template class Dropout<B>; \
  template class Act<B>;     \
  template class SwiGLU<B>;  \
  template Var<B> functional::swiglu<B>(const Var<B>&, const Var<B>&);
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn
