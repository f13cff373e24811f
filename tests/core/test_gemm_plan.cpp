// backends/gemm_plan.hpp on its own: the cases the Cpu and Cuda matmuls rely on (operand
// classification, staging of broadcast operands, batch coalescing, folding the batch into M).
#include <catch2/catch.hpp>

#include <array>
#include <vector>

#include <kiln/backends/gemm_plan.hpp>

using namespace kiln;

namespace {
// The layout of a contiguous tensor, then a view of it through permuted axes.
Layout permuted(const Shape& s, const std::vector<size_t>& perm, int64_t offset = 0) {
  const Layout c(s);
  Shape ps;
  Strides st;
  for (size_t p : perm) {
    ps.push_back(s[p]);
    st.push_back(c.strides[p]);
  }
  return Layout(ps, st, offset);
}
std::vector<std::array<int64_t, 3>> items(const std::vector<gemm::BatchDim>& dims, int64_t oa, int64_t ob, int64_t oc) {
  std::vector<std::array<int64_t, 3>> v;
  gemm::for_each_item(dims, oa, ob, oc, [&](int64_t a, int64_t b, int64_t c) { v.push_back({a, b, c}); });
  return v;
}
}  // namespace

TEST_CASE("gemm plan: classify takes row-major and transposed matrices as they lie", "[gemm]") {
  // x [M=4, K=3] contiguous: row-major, ld 3
  gemm::Operand o = gemm::classify(Layout({4, 3}), 4, 3);
  CHECK((o.ok && !o.trans && o.ld == 3));
  // W.t() of W [N=5, K=3]: [3, 5] with strides (1, 3): column-major, ld 3 (x @ Wᵀ without a copy)
  o = gemm::classify(permuted({5, 3}, {1, 0}), 3, 5);
  CHECK((o.ok && o.trans && o.ld == 3));
  // rows of a wider buffer (a narrowed view): row-major, ld = the row stride
  o = gemm::classify(Layout({4, 3}, {10, 1}, 2), 4, 3);
  CHECK((o.ok && !o.trans && o.ld == 10));
  // a single row or column: any stride along the size-1 dim
  o = gemm::classify(Layout({1, 6}, {99, 1}, 0), 1, 6);
  CHECK((o.ok && !o.trans && o.ld == 6));
  o = gemm::classify(Layout({6, 1}, {1, 42}, 0), 6, 1);
  CHECK((o.ok && !o.trans && o.ld == 1));
}

TEST_CASE("gemm plan: classify refuses matrices no BLAS layout describes", "[gemm]") {
  CHECK_FALSE(gemm::classify(Layout({4, 3}, {6, 2}, 0), 4, 3).ok);  // no unit stride (a strided slice)
  CHECK_FALSE(gemm::classify(Layout({4, 3}, {0, 1}, 0), 4, 3).ok);  // broadcast rows (stride 0 inside the matrix)
  CHECK_FALSE(gemm::classify(Layout({4, 3}, {2, 1}, 0), 4, 3).ok);  // overlapping rows (ld < cols)
}

TEST_CASE("gemm plan: staging keeps a broadcast batch dim unmaterialised", "[gemm]") {
  // [B=3, K=4, N=5] expanded from [1, 4, 5] and transposed in the matrix: stride 0 along the batch
  const Layout v({3, 4, 5}, {0, 1, 4}, 7);
  const gemm::Staging s = gemm::staging(v);
  CHECK(s.layout.shape == Shape{3, 4, 5});
  CHECK(s.layout.strides == Strides{0, 5, 1});  // dense matrix, batch still stride 0
  CHECK(s.layout.offset == 0);
  CHECK(s.elements == 20);               // one matrix, not three
  CHECK(s.src.shape == Shape{1, 4, 5});  // the copy reads the distinct elements only
  CHECK(s.src.strides == v.strides);
  CHECK(s.src.offset == 7);
  CHECK(s.dst.shape == Shape{1, 4, 5});
  CHECK(gemm::classify(s.layout, 4, 5).ok);
  // a plain batch is staged densely
  const gemm::Staging d = gemm::staging(Layout({2, 3, 4}, {24, 1, 6}, 0));
  CHECK(d.layout.strides == Strides{12, 4, 1});
  CHECK(d.elements == 24);
}

TEST_CASE("gemm plan: coalesce drops size-1 batch dims and merges contiguous ones", "[gemm]") {
  // [2, 1, 3, M=4, K=5] @ [2, 1, 3, 5, N=6] -> [2, 1, 3, 4, 6], all contiguous: one batch dim of 6
  const Layout a({2, 1, 3, 4, 5}), b({2, 1, 3, 5, 6}), c({2, 1, 3, 4, 6});
  const std::vector<gemm::BatchDim> dims = gemm::coalesce(a, b, c);
  REQUIRE(dims.size() == 1);
  CHECK(dims[0].size == 6);
  CHECK((dims[0].sa == 20 && dims[0].sb == 30 && dims[0].sc == 24));
  // permuted [B, T, H, d] heads: [B=2, H=3, T=4, d=5] viewed from [2, 4, 3, 5] do not merge
  const Layout q = permuted({2, 4, 3, 5}, {0, 2, 1, 3}), k = permuted({2, 4, 3, 5}, {0, 2, 3, 1}), o({2, 3, 4, 4});
  const std::vector<gemm::BatchDim> hd = gemm::coalesce(q, k, o);
  REQUIRE(hd.size() == 2);
  CHECK((hd[0].size == 3 && hd[0].sa == 5 && hd[0].sc == 16));  // innermost first: heads
  CHECK((hd[1].size == 2 && hd[1].sa == 60 && hd[1].sc == 48));
  CHECK(gemm::coalesce(Layout({4, 5}), Layout({5, 6}), Layout({4, 6})).empty());  // a single product
}

TEST_CASE("gemm plan: [B, T, K] @ [K, N] folds the batch into M, other batches do not", "[gemm]") {
  const int64_t B = 3, T = 4, K = 5, N = 6;
  const Layout x({B, T, K}), y({B, T, N});
  const Layout w = permuted({N, K}, {1, 0});                       // Wᵀ [K, N]
  const Layout wb({B, K, N}, {0, w.strides[0], w.strides[1]}, 0);  // broadcast over the batch
  const gemm::Operand A = gemm::classify(x, T, K), C = gemm::classify(y, T, N);
  std::vector<gemm::BatchDim> dims = gemm::coalesce(x, wb, y);
  CHECK(gemm::folds(dims, T, A, C));
  // b differs per item: no fold
  dims = gemm::coalesce(x, Layout({B, K, N}), y);
  CHECK_FALSE(gemm::folds(dims, T, A, C));
  // a's rows not evenly spaced across the batch (each item narrowed from a longer sequence)
  const Layout xn({B, T, K}, {2 * T * K, K, 1}, 0);
  dims = gemm::coalesce(xn, wb, y);
  CHECK_FALSE(gemm::folds(dims, T, gemm::classify(xn, T, K), C));
  // a stored transposed: its rows are not rows of memory
  const Layout xt({B, T, K}, {T * K, 1, T}, 0);
  dims = gemm::coalesce(xt, wb, y);
  CHECK_FALSE(gemm::folds(dims, T, gemm::classify(xt, T, K), C));
}

TEST_CASE("gemm plan: for_each_item walks the batch innermost first from the base offsets", "[gemm]") {
  const std::vector<gemm::BatchDim> dims{{2, 10, 0, 100}, {3, 1000, 7, 10000}};
  const auto v = items(dims, 1, 2, 3);
  REQUIRE(v.size() == 6);
  CHECK(v[0] == std::array<int64_t, 3>{1, 2, 3});
  CHECK(v[1] == std::array<int64_t, 3>{11, 2, 103});
  CHECK(v[2] == std::array<int64_t, 3>{1001, 9, 10003});
  CHECK(v[5] == std::array<int64_t, 3>{2011, 16, 20103});
  CHECK(items({}, 4, 5, 6) == std::vector<std::array<int64_t, 3>>{{4, 5, 6}});  // no batch: one product
  CHECK(items({{0, 1, 1, 1}}, 0, 0, 0).empty());                                // an empty batch: none
}
