#include "kiln/nn/embedding.hpp"

#include "kiln/nn/init.hpp"

namespace kiln::nn {

template <Backend B> Embedding<B>::Embedding(EmbeddingOptions o) : o_(o) {
  KILN_CHECK(o.num >= 1 && o.dim >= 1, "Embedding: num and dim must be >= 1, got num={} dim={}", o.num, o.dim);
  w_ = this->register_parameter("weight", Tensor<B>::empty({o.num, o.dim}, o.dtype));
  init::normal_(w_, 0.0, 1.0);
}

template <Backend B> Var<B> Embedding<B>::forward(const Tensor<B>& ids) const {
  KILN_CHECK(is_integral(ids.dtype()), "Embedding: ids must be i32 or i64, got {} (shape {})", ids.dtype(), shape_str(ids.shape()));
  Shape out = ids.shape();
  out.push_back(o_.dim);
  return w_.index_select(0, ids.reshape({-1})).reshape(out);
}

#define KILN_INST(B) template class Embedding<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn
