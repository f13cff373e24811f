#pragma once
// Linear: y = x Wᵀ (+ b).
// # Shapes
//   weight [out, in] (PyTorch layout), bias [out]; x [..., in] -> y [..., out]
// Init: PyTorch's default, U(−1/√in, 1/√in) for weight and bias.
#include "kiln/nn/module.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::nn {

// The defaults are torch.nn.Linear's (bias = true, as Conv2dOptions'); the transformer layers ask for
// bias = false themselves. docs/layers.md, "Porting from PyTorch", lists where kiln's options differ.
struct LinearOptions {
  int64_t in = 0;
  int64_t out = 0;
  bool bias = true;
  DType dtype = DType::f32;
};

// A term added to a Linear's output, y = x Wᵀ + b + adapter(x): how LoRA (nn/lora.hpp) wraps any
// Linear of any model in place, without the model's code knowing.
template <Backend B> class LinearAdapter {
 public:
  virtual ~LinearAdapter() = default;
  virtual Var<B> forward(const Var<B>& x) const = 0;
};

template <Backend B> class Linear : public Module<B> {
 public:
  explicit Linear(LinearOptions o);
  Var<B> forward(const Var<B>& x) const;
  Var<B> operator()(const Var<B>& x) const { return forward(x); }

  const LinearOptions& options() const { return o_; }
  Var<B>& weight() { return w_; }
  Var<B>& bias() { return b_; }

  // Attaches an adapter, its submodules registered under this Linear by the given names (so LoRA's
  // parameters are "<path>.lora_A.weight", as PEFT names them); one adapter at a time.
  void set_adapter(std::shared_ptr<LinearAdapter<B>> a, const std::vector<std::pair<std::string, std::shared_ptr<Module<B>>>>& modules);
  // Detaches it and its submodules: the module is a plain Linear again.
  void remove_adapter();
  LinearAdapter<B>* adapter() const { return adapter_.get(); }

 private:
  LinearOptions o_;
  Var<B> w_, b_;
  std::shared_ptr<LinearAdapter<B>> adapter_;
  std::vector<std::string> adapter_modules_;
};

#define KILN_EXTERN(B) extern template class Linear<B>;
KILN_FOR_EACH_BACKEND(KILN_EXTERN)
#undef KILN_EXTERN

}  // namespace kiln::nn
#pragma GCC visibility pop
