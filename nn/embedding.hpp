#pragma once
// Embedding: a lookup table.
// # Shapes
//   weight [num, dim]; ids (i32/i64, any shape S, values in [0, num)) -> [S..., dim]
// Init: N(0, 1), PyTorch's default. Out-of-range ids are a kiln::Error naming the id and num.
// padding_idx (torch.nn.Embedding's): that row is initialised to zeros and gets no gradient (its
// looked-up vectors still read the row as it is, so a row set by hand pads with that vector); a
// negative value counts from the end (num + padding_idx), as PyTorch.
#include <optional>

#include "kiln/nn/module.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::nn {

struct EmbeddingOptions {
  int64_t num = 0;
  int64_t dim = 0;
  DType dtype = DType::f32;
  std::optional<int64_t> padding_idx{};  // in [-num, num)
};

template <Backend B> class Embedding : public Module<B> {
 public:
  explicit Embedding(EmbeddingOptions o);
  Var<B> forward(const Tensor<B>& ids) const;
  Var<B> operator()(const Tensor<B>& ids) const { return forward(ids); }
  Var<B>& weight() { return w_; }
  const EmbeddingOptions& options() const { return o_; }
  std::optional<int64_t> padding_idx() const { return pad_; }  // in [0, num)

 private:
  EmbeddingOptions o_;
  Var<B> w_;
  std::optional<int64_t> pad_;
};

#define KILN_EXTERN(B) extern template class Embedding<B>;
KILN_FOR_EACH_BACKEND(KILN_EXTERN)
#undef KILN_EXTERN

}  // namespace kiln::nn
#pragma GCC visibility pop
