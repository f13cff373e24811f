// matmul with torch.matmul semantics:
//   a [..., M, K] @ b [..., K, N] -> y [broadcast(...), M, N]
//   a [K] is treated as [1, K] (the M axis is dropped from y); b [K] as [K, 1] (the N axis is dropped).
// Backward, with a2/b2/g2 the operands and dy with those axes restored:
//   da2 = dy2 @ b2^T  [batch, M, K] -> summed over broadcast batch dims to a2's shape -> a's shape
//   db2 = a2^T @ dy2  [batch, K, N] -> summed to b2's shape -> b's shape
// Each operand is saved only when the other one needs a gradient.
// A 2-D operand b stored transposed (b = W.t() of a contiguous W, as Linear passes its weight) gets its
// gradient in that layout too: db = (dyᵀ · a)ᵀ, a transposed view of a contiguous [N, K] product, so
// the t() node hands W a contiguous gradient the leaf takes as it is (no transposing copy per step).
// Under autocast (autograd/autocast.hpp, policy low) both operands are cast to the low dtype first; the product
// and its gradients then run in that dtype (f32 accumulation in the kernels) and the casts' backward
// brings the gradients back to the operands' own dtypes.
#include "kiln/autograd/autocast.hpp"
#include "kiln/autograd/record.hpp"

namespace kiln::autograd {

namespace {
// The product on operands autocast has already seen.
template <Backend B> Var<B> product(const Var<B>& a, const Var<B>& b) {
  using T = Tensor<B>;
  const bool na = needs_grad(a), nb = needs_grad(b);
  const T& bval = b.value();
  const bool b_cols = a.dim() == 2 && b.dim() == 2 && bval.shape()[0] > 1 && bval.shape()[1] > 1 && bval.strides()[0] == 1 &&
                      bval.strides()[1] == bval.shape()[0];
  return record<B>("matmul", a.value().matmul(bval), {&a, &b},
                   [na, nb, b_cols, sa = a.shape(), sb = b.shape(), av = keep_if(nb, a.value()), bv = keep_if(na, bval)](const T& g) {
                     const bool a1 = sa.size() == 1, b1 = sb.size() == 1;
                     T g2 = g;
                     if (a1 && b1)
                       g2 = g.reshape({1, 1});
                     else if (b1)
                       g2 = g.unsqueeze(-1);
                     else if (a1)
                       g2 = g.unsqueeze(-2);
                     Shape sa2 = sa, sb2 = sb;
                     if (a1) sa2.insert(sa2.begin(), 1);
                     if (b1) sb2.push_back(1);
                     T ga, gb;
                     if (na) {
                       const T b2 = b1 ? bv.unsqueeze(-1) : bv;
                       ga = g2.matmul(b2.transpose(-1, -2)).sum_to(sa2).reshape(sa);
                     }
                     if (nb && b_cols) {
                       gb = g.transpose(-1, -2).matmul(av).transpose(-1, -2);
                     } else if (nb) {
                       const T a2 = a1 ? av.unsqueeze(0) : av;
                       gb = a2.transpose(-1, -2).matmul(g2).sum_to(sb2).reshape(sb);
                     }
                     return Grads<B>{ga, gb};
                   });
}
}  // namespace

template <Backend B> Var<B> Linalg<B>::matmul(const Var<B>& a, const Var<B>& b) {
  return product(autocast::cast(autocast::Op::matmul, a), autocast::cast(autocast::Op::matmul, b));
}

// y = x @ wᵀ (+ bias)    x [N, in], w [out, in], bias [out] or undefined -> y [N, out]
// autocast's linear: x, w and bias are cast once, w before its transpose so that the cast cache sees
// the parameter itself; the product then runs on them as they are (no second autocast decision).
template <Backend B> Var<B> Linalg<B>::linear(const Var<B>& x_in, const Var<B>& w_in, const Var<B>& bias) {
  constexpr auto op = autocast::Op::linear;
  const Var<B> y = product(autocast::cast(op, x_in), autocast::cast(op, w_in).t());
  return bias.defined() ? y + autocast::cast(op, bias) : y;
}

#define KILN_INST(B) template struct Linalg<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::autograd
