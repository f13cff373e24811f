#pragma once
// GEMM planning shared by the backends' matmuls (backends/cpu/matmul.cpp, backends/cuda/matmul.cpp):
// pure host code on layouts, no memory touched, unit-tested on its own (tests/core/test_gemm_plan.cpp).
//
// out [..., M, N] = a [..., M, K] @ b [..., K, N], every operand a strided view of one rank:
//  1. classify: each matrix goes to the BLAS as it lies when one of its two dims has unit stride
//     (row-major, ld = the row stride; or column-major = "trans", ld = the column stride: x @ Wᵀ with
//     W [N, K] costs no copy); otherwise it must be staged.
//  2. staging: the dense layout of a staged copy. Zero-stride (broadcast) batch dims stay zero-stride
//     and only the distinct elements are copied, so a broadcast operand is not materialised.
//  3. coalesce: the batch dims with size-1 dims dropped and adjacent dims merged where every operand's
//     strides allow (zero strides included), innermost first.
//  4. fold: when b is the same matrix for every batch item (one batch dim of stride 0:
//     [B, T, K] @ [K, N]) and the rows of a and out (both row-major) are evenly spaced across the
//     batch, the batch folds into M and one large GEMM runs.
// What a backend does with the plan (library choice, which dim becomes a strided batch, the loops) stays
// in the backend.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kiln/core/shape.hpp"

namespace kiln::gemm {

// How one matrix (rows x cols, strides rs, cs) goes to the BLAS.
struct Operand {
  bool ok = false;     // false: it must be staged (a contiguous copy)
  bool trans = false;  // stored as its transpose (column-major: unit stride along rows)
  int64_t ld = 0;      // the leading dimension
};

inline Operand classify(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  if ((cols == 1 || cs == 1) && (rows == 1 || rs >= std::max<int64_t>(cols, 1)))
    return {true, false, rows == 1 ? std::max<int64_t>(cols, 1) : rs};
  if ((rows == 1 || rs == 1) && (cols == 1 || cs >= std::max<int64_t>(rows, 1)))
    return {true, true, cols == 1 ? std::max<int64_t>(rows, 1) : cs};
  return {};
}

// The matrix (the last two dims, rows x cols) of a layout of rank >= 2.
inline Operand classify(const Layout& l, int64_t rows, int64_t cols) {
  const size_t r = l.shape.size();
  return classify(rows, cols, l.strides[r - 2], l.strides[r - 1]);
}

// A staged copy of a view: `layout` is the copy's (offset 0, `elements` elements to allocate); the copy
// itself runs from `src` (the view, broadcast batch dims cut to size 1) to `dst` (the copy, likewise).
struct Staging {
  Layout layout, src, dst;
  int64_t elements = 0;
};

inline Staging staging(const Layout& v) {
  const Shape& s = v.shape;
  Strides st(s.size());
  int64_t acc = 1;
  const size_t nb = s.size() >= 2 ? s.size() - 2 : 0;
  for (size_t i = s.size(); i-- > 0;) {
    if (i < nb && s[i] > 1 && v.strides[i] == 0) {
      st[i] = 0;
    } else {
      st[i] = acc;
      acc *= std::max<int64_t>(s[i], 1);
    }
  }
  Shape cut = s;
  for (size_t i = 0; i < nb; ++i)
    if (s[i] > 1 && v.strides[i] == 0) cut[i] = 1;
  return {Layout(s, st, 0), Layout(cut, v.strides, v.offset), Layout(cut, st, 0), acc};
}

// One coalesced batch dim: its size and the element strides of a, b and out along it.
struct BatchDim {
  int64_t size, sa, sb, sc;
};

// The batch dims (all but the last two of out's shape) of a, b, out coalesced, innermost first; empty
// for a single product.
inline std::vector<BatchDim> coalesce(const Layout& a, const Layout& b, const Layout& c) {
  std::vector<BatchDim> dims;
  const size_t nb = c.shape.size() >= 2 ? c.shape.size() - 2 : 0;
  for (size_t i = nb; i-- > 0;) {
    if (c.shape[i] == 1) continue;
    const BatchDim d{c.shape[i], a.strides[i], b.strides[i], c.strides[i]};
    if (!dims.empty()) {
      BatchDim& in = dims.back();  // the dim just inside this one
      if (d.sa == in.sa * in.size && d.sb == in.sb * in.size && d.sc == in.sc * in.size) {
        in.size *= d.size;
        continue;
      }
    }
    dims.push_back(d);
  }
  return dims;
}

// Whether the batch folds into M (step 4 above): then one GEMM of M · dims[0].size rows runs at the
// operands' offsets.
inline bool folds(const std::vector<BatchDim>& dims, int64_t M, const Operand& a, const Operand& c) {
  return dims.size() == 1 && dims[0].sb == 0 && !a.trans && !c.trans && dims[0].sa == M * a.ld && dims[0].sc == M * c.ld;
}

// Calls f(oa, ob, oc) with the element offsets of every batch item (the innermost dim fastest), from
// the base offsets; once, with the bases, when dims is empty; never when a dim has size 0.
template <class F> void for_each_item(const std::vector<BatchDim>& dims, int64_t oa, int64_t ob, int64_t oc, F&& f) {
  for (const BatchDim& d : dims)
    if (d.size == 0) return;
  std::vector<int64_t> idx(dims.size(), 0);
  while (true) {
    int64_t a = oa, b = ob, c = oc;
    for (size_t i = 0; i < dims.size(); ++i) {
      a += idx[i] * dims[i].sa;
      b += idx[i] * dims[i].sb;
      c += idx[i] * dims[i].sc;
    }
    f(a, b, c);
    size_t i = 0;
    for (; i < dims.size(); ++i) {
      if (++idx[i] < dims[i].size) break;
      idx[i] = 0;
    }
    if (i == dims.size()) return;
  }
}

}  // namespace kiln::gemm
