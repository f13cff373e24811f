#include "kiln/nn/linear.hpp"

#include <cmath>

#include "kiln/autograd/ops.hpp"
#include "kiln/nn/init.hpp"

namespace kiln::nn {

template <Backend B> Linear<B>::Linear(LinearOptions o) : o_(o) {
  KILN_CHECK(o.in >= 1 && o.out >= 1, "Linear: in and out must be >= 1, got in={} out={}", o.in, o.out);
  w_ = this->register_parameter("weight", Tensor<B>::empty({o.out, o.in}, o.dtype));
  const double bound = 1.0 / std::sqrt(static_cast<double>(o.in));
  init::uniform_(w_, -bound, bound);
  if (o.bias) {
    b_ = this->register_parameter("bias", Tensor<B>::empty({o.out}, o.dtype));
    init::uniform_(b_, -bound, bound);
  }
}

template <Backend B> Var<B> Linear<B>::forward(const Var<B>& x) const {
  KILN_CHECK(x.dim() >= 1 && x.shape().back() == o_.in, "Linear: input {} does not end in in_features={}", shape_str(x.shape()), o_.in);
  // [..., in] -> [N, in] (a view for contiguous x) so the product is one GEMM, not a batch of small ones.
  Shape out_shape = x.shape();
  out_shape.back() = o_.out;
  const Var<B> x2 = x.dim() == 2 ? x : x.reshape({-1, o_.in});
  // Under autocast, linear casts x, the weight and the bias once each (autograd/ops/matmul.cpp).
  const Var<B> y = autograd::Linalg<B>::linear(x2, w_, o_.bias ? b_ : Var<B>());
  const Var<B> out = x.dim() == 2 ? y : y.reshape(out_shape);
  return adapter_ ? out + adapter_->forward(x) : out;
}

template <Backend B> void Linear<B>::set_adapter(std::shared_ptr<LinearAdapter<B>> a,
                                                 const std::vector<std::pair<std::string, std::shared_ptr<Module<B>>>>& modules) {
  KILN_CHECK(a != nullptr, "Linear::set_adapter: the adapter is null");
  KILN_CHECK(adapter_ == nullptr, "Linear::set_adapter: this Linear [{}, {}] has an adapter already", o_.out, o_.in);
  for (const auto& [name, m] : modules) {
    this->register_module(name, m);
    adapter_modules_.push_back(name);
  }
  adapter_ = std::move(a);
}

template <Backend B> void Linear<B>::remove_adapter() {
  for (const auto& name : adapter_modules_) this->remove_module(name);
  adapter_modules_.clear();
  adapter_.reset();
}

#define KILN_INST(B) template class Linear<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn
