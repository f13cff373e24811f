#include "kiln/nn/embedding.hpp"

#include "kiln/nn/init.hpp"

namespace kiln::nn {

template <Backend B> Embedding<B>::Embedding(EmbeddingOptions o) : o_(o) {
  KILN_CHECK(o.num >= 1 && o.dim >= 1, "Embedding: num and dim must be >= 1, got num={} dim={}", o.num, o.dim);
  w_ = this->register_parameter("weight", Tensor<B>::empty({o.num, o.dim}, o.dtype));
  init::normal_(w_, 0.0, 1.0);
  if (o.padding_idx) {
    const int64_t p = *o.padding_idx;
    KILN_CHECK(p >= -o.num && p < o.num, "Embedding: padding_idx must be in [-num, num) = [{}, {}), got {}", -o.num, o.num, p);
    pad_ = p < 0 ? p + o.num : p;
    NoGrad ng;
    w_.value().select(0, *pad_).zero_();
  }
}

template <Backend B> Var<B> Embedding<B>::forward(const Tensor<B>& ids) const {
  KILN_CHECK(is_integral(ids.dtype()), "Embedding: ids must be i32 or i64, got {} (shape {})", ids.dtype(), shape_str(ids.shape()));
  Shape out = ids.shape();
  out.push_back(o_.dim);
  const Tensor<B> flat = ids.reshape({-1});
  Var<B> rows = w_.index_select(0, flat);
  if (pad_) {  // the padding row's vectors read as they are, but pass no gradient back to it
    const Tensor<B> real = flat.ne(Scalar(*pad_)).reshape({-1, 1});
    rows = Var<B>::where(real, rows, rows.detach());
  }
  return rows.reshape(out);
}

#define KILN_INST(B) template class Embedding<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::nn
