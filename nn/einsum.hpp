#pragma once
// einsum: torch.einsum's equations over matmul, reductions and views (composed Var ops, so gradients
// come from theirs).
//   einsum("ij,jk->ik", {a, b}); einsum("bhqd,bhkd->bhqk", {q, k}); einsum("ij->ji", {a}); einsum("i,i->", {u, v})
// Subscripts are letters; without "->" the output is the letters that appear once, in alphabetical
// order (PyTorch's implicit mode). Operands are contracted left to right: letters that appear in only
// one operand and not in the output are summed first, the two operands of a step are laid out as
// [batch, free, contracted] and multiplied with one batched matmul. Each letter must have one size in
// every operand. Not supported (a kiln::Error says so): "..." (ellipsis), a letter repeated within one
// operand (diagonals, traces), size-1 broadcasting of a letter.
#include <string_view>
#include <vector>

#include "kiln/autograd/var.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

template <Backend B> KILN_API Var<B> einsum(std::string_view equation, const std::vector<Var<B>>& operands);

#define KILN_EINSUM_EXTERN(B) extern template Var<B> einsum<B>(std::string_view, const std::vector<Var<B>>&);
KILN_FOR_EACH_BACKEND(KILN_EINSUM_EXTERN)
#undef KILN_EINSUM_EXTERN

}  // namespace kiln
#pragma GCC visibility pop
