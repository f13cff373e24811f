#pragma once
// Multi-tensor Adam/AdamW step (see core/fused.hpp for the override pattern): one call updates every
// parameter of a group, element by element in one pass over w, g, m, v (the composite takes eight
// tensor ops per parameter, each a kernel launch or a parallel region):
//   decoupled (AdamW): w ← w·(1 − lr·wd);   else (Adam): g ← g + wd·w
//   m ← β1·m + (1 − β1)·g;   v ← β2·v + (1 − β2)·g²
//   w ← w − (lr / bc1) · m / (√v / √bc2 + eps),   bc1 = 1 − β1^t, bc2 = 1 − β2^t
// A backend overrides with
//   adam_step(const std::vector<MutView>& w, const std::vector<MutView>& m, const std::vector<MutView>& v,
//             const std::vector<View>& g, const AdamHyper& h)
// receiving contiguous tensors, each quadruple of one shape and one dtype (f32 or f64). Others (half
// types, strided) take the composite path here.
//
// Multi-tensor sum of squares (the squared global norm of clip_grad_norm_): Σ over every tensor of
// Σ x², each square and the sum in f64, returned as a [] f64 tensor on the device (nothing is read
// back). A backend overrides with
//   sum_squares(MutView out, const std::vector<View>& xs)
// writing the f64 scalar out from contiguous f32/f64 tensors; the composite is to(f64).square().sum()
// per tensor (five passes over each gradient and an f64 copy of it, where the kernel reads it once).
#include <cmath>
#include <vector>

#include "kiln/core/fused_optim_params.hpp"
#include "kiln/core/tensor.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::fused {

template <class B>
concept HasAdam = requires(const std::vector<MutView<typename B::Storage>>& w, const std::vector<View<typename B::Storage>>& g,
                           const AdamHyper& h) {
  B::adam_step(w, w, w, g, h);
};

template <class B>
concept HasSumSquares = requires(MutView<typename B::Storage> out, const std::vector<View<typename B::Storage>>& xs) {
  B::sum_squares(out, xs);
};

// The composite update of one parameter (also the oracle of the fused kernels).
template <Backend B> void adam_step_composite(Tensor<B>& w, Tensor<B>& m, Tensor<B>& v, Tensor<B> grad, const AdamHyper& h) {
  if (h.weight_decay != 0) {
    if (h.decoupled)
      w.mul_(1.0 - h.lr * h.weight_decay);
    else
      grad = grad.add(w.mul(h.weight_decay));
  }
  m.mul_(h.beta1).add_(grad.mul(1.0 - h.beta1));
  v.mul_(h.beta2).add_(grad.mul(grad).mul(1.0 - h.beta2));
  const Tensor<B> denom = v.sqrt().div(h.bc2_sqrt).add(h.eps);
  w.sub_(m.div(denom).mul(h.lr / h.bc1));
}

// Updates w[i], m[i], v[i] in place from g[i], for every i.
template <Backend B> void adam_step(const std::vector<Tensor<B>*>& w, const std::vector<Tensor<B>*>& m, const std::vector<Tensor<B>*>& v,
                                    const std::vector<Tensor<B>>& g, const AdamHyper& h) {
  KILN_CHECK(w.size() == m.size() && w.size() == v.size() && w.size() == g.size(), "adam_step: {} weights, {} m, {} v, {} gradients",
             w.size(), m.size(), v.size(), g.size());
  std::vector<size_t> fused_idx;
  for (size_t i = 0; i < w.size(); ++i) {
    const Tensor<B>& p = *w[i];
    KILN_CHECK(m[i]->shape() == p.shape() && v[i]->shape() == p.shape() && g[i].shape() == p.shape(),
               "adam_step: parameter {} has shape {}, m {}, v {}, gradient {}", i, shape_str(p.shape()), shape_str(m[i]->shape()),
               shape_str(v[i]->shape()), shape_str(g[i].shape()));
    bool fusable = false;
    if constexpr (HasAdam<B>) {
      const DType d = p.dtype();
      fusable = (d == DType::f32 || d == DType::f64) && m[i]->dtype() == d && v[i]->dtype() == d && g[i].dtype() == d &&
                p.is_contiguous() && m[i]->is_contiguous() && v[i]->is_contiguous() && g[i].is_contiguous();
    }
    if (fusable)
      fused_idx.push_back(i);
    else
      adam_step_composite(*w[i], *m[i], *v[i], g[i], h);
  }
  if constexpr (HasAdam<B>) {
    if (fused_idx.empty()) return;
    std::vector<MutView<typename B::Storage>> wv, mv, vv;
    std::vector<View<typename B::Storage>> gv;
    for (size_t i : fused_idx) {
      if (w[i]->numel() == 0) continue;
      wv.push_back(w[i]->mview());
      mv.push_back(m[i]->mview());
      vv.push_back(v[i]->mview());
      gv.push_back(g[i].cview());
    }
    if (!wv.empty()) KILN_PROFILED("adam_step", wv, mv, vv, gv) B::adam_step(wv, mv, vv, gv, h);
  }
}

// Σ_i Σ xs[i]², in f64, as a [] f64 tensor (undefined tensors and empty ones add nothing).
template <Backend B> Tensor<B> sum_squares(const std::vector<Tensor<B>>& xs) {
  Tensor<B> total;
  auto add = [&](const Tensor<B>& s) { total = total.defined() ? total.add(s) : s; };
  std::vector<View<typename B::Storage>> fv;
  for (const Tensor<B>& x : xs) {
    if (!x.defined() || !x.numel()) continue;
    KILN_CHECK(is_floating(x.dtype()), "sum_squares: tensors must be floating, got {} {}", x.dtype(), shape_str(x.shape()));
    bool fusable = false;
    if constexpr (HasSumSquares<B>) fusable = (x.dtype() == DType::f32 || x.dtype() == DType::f64) && x.is_contiguous();
    if (fusable)
      fv.push_back(x.cview());
    else
      add(x.to(DType::f64).square().sum());
  }
  if constexpr (HasSumSquares<B>) {
    if (!fv.empty()) {
      Tensor<B> out = Tensor<B>::empty(Shape{}, DType::f64);
      KILN_PROFILED("sum_squares", out.mview(), fv) B::sum_squares(out.mview(), fv);
      add(out);
    }
  }
  return total.defined() ? total : Tensor<B>::zeros(Shape{}, DType::f64);
}

}  // namespace kiln::fused
#pragma GCC visibility pop
