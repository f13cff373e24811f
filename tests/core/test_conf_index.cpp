// Conformance: cat/stack/split/chunk and gather/index_select/scatter_add/index_add (repeated indices,
// i32/i64 indices, strided operands) against Reference, plus hand-computed cases.
#include <algorithm>

#include "common/kiln_test.hpp"

using namespace kiln;
using namespace kt;

TEMPLATE_TEST_CASE("conformance: cat, stack, split, chunk", "[core][conformance][combine]", KILN_TEST_BACKENDS) {
  using B = TestType;
  Gen g(1111);
  for (int it = 0; it < 80; ++it) {
    const DType d = g.pick(kAllDTypes);
    const Shape s = g.shape(1, 4, 5);
    const int64_t r = static_cast<int64_t>(s.size());
    const int64_t a = g.integer(-r, r - 1);
    const size_t ua = static_cast<size_t>(a < 0 ? a + r : a);
    const int64_t k = g.integer(1, 4);
    std::vector<RT> rs;
    std::vector<Tensor<B>> bs;
    std::vector<std::string> parts;
    for (int64_t i = 0; i < k; ++i) {
      Shape si = s;
      si[ua] = g.integer(0, 4);
      RT x;
      Tensor<B> y;
      const Lay l = g.pick(kLayouts);
      g.make_pair(si, d, l, x, y);
      rs.push_back(x);
      bs.push_back(y);
      parts.push_back(describe(si, d, l));
    }
    const std::string w = fmt::format("axis {} of {}", a, fmt::join(parts, "; "));
    const auto c = Tensor<B>::cat(bs, a);
    check_equal(c, RT::cat(rs, a), "cat " + w);
    // split back by the original sizes: identity (independent of Reference)
    std::vector<int64_t> sizes;
    for (const auto& x : rs) sizes.push_back(x.shape()[ua]);
    const auto back = c.split(sizes, a);
    REQUIRE(back.size() == rs.size());
    for (size_t i = 0; i < back.size(); ++i) check_equal(back[i], rs[i], fmt::format("cat then split, part {} of {}", i, w));
    // stack of equal shapes
    std::vector<RT> rsame;
    std::vector<Tensor<B>> bsame;
    for (int64_t i = 0; i < k; ++i) {
      RT x;
      Tensor<B> y;
      g.make_pair(s, d, g.pick(kLayouts), x, y);
      rsame.push_back(x);
      bsame.push_back(y);
    }
    const int64_t sa = g.integer(-r - 1, r);
    const auto st = Tensor<B>::stack(bsame, sa);
    check_equal(st, RT::stack(rsame, sa), fmt::format("stack axis {} of {} x {}", sa, k, shape_str(s)));
    for (int64_t i = 0; i < k; ++i) check_equal(st.select(sa, i), rsame[static_cast<size_t>(i)], "stack then select");
    // split by size and chunk: pieces cover the axis in order
    const int64_t sz = g.integer(1, 4);
    const auto pieces = c.split(sz, a);
    check_equal(Tensor<B>::cat(pieces, a), c, fmt::format("cat(split({})) of {}", sz, w));
    for (size_t i = 0; i + 1 < pieces.size(); ++i) CHECK(pieces[i].shape()[ua] == sz);
    const int64_t nch = g.integer(1, 5);
    const auto ch = c.chunk(nch, a);
    CHECK(static_cast<int64_t>(ch.size()) <= nch);
    check_equal(Tensor<B>::cat(ch, a), c, fmt::format("cat(chunk({})) of {}", nch, w));
  }
}

TEMPLATE_TEST_CASE("conformance: gather, index_select, scatter_add, index_add", "[core][conformance][index]", KILN_TEST_BACKENDS) {
  using B = TestType;
  Gen g(1212);
  for (int it = 0; it < 120; ++it) {
    const DType d = g.pick(std::vector<DType>{DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64});
    const DType id = g.coin() ? DType::i64 : DType::i32;
    const Shape s = g.shape(1, 4, 5, 0.0);
    const int64_t r = static_cast<int64_t>(s.size());
    const int64_t a = g.integer(-r, r - 1);
    const size_t ua = static_cast<size_t>(a < 0 ? a + r : a);
    const Lay l = g.pick(kLayouts);
    RT rx;
    Tensor<B> bx;
    g.make_pair(s, d, l, rx, bx);
    const std::string w = fmt::format("{} axis {} index {}", describe(s, d, l), a, dtype_name(id));
    // gather: index shape <= input shape off the axis, any length on it; repeats are frequent
    Shape is = s;
    for (size_t i = 0; i < is.size(); ++i) is[i] = i == ua ? g.integer(0, 6) : g.integer(0, s[i]);
    const std::vector<double> iv = g.values(numel(is), DType::i64, 0, static_cast<double>(s[ua] - 1));
    const RT ri = RT::from_vector(iv, is).to(id);
    const Tensor<B> bi = ri.template to<B>();
    check_equal(bx.gather(a, bi), rx.gather(a, ri), fmt::format("gather {} with index {}", w, shape_str(is)));
    // index_select with a strided 1-D index
    const std::vector<double> sv = g.values(2 * g.integer(0, 6), DType::i64, 0, static_cast<double>(s[ua] - 1));
    const RT rsi = RT::from_vector(sv).to(id).slice(0, 0, static_cast<int64_t>(sv.size()), 2);
    const Tensor<B> bsi = rsi.template to<B>().contiguous();
    check_equal(bx.index_select(a, bsi), rx.index_select(a, rsi), fmt::format("index_select {} with {} indices", w, rsi.numel()));
    // scatter_add: src at least as large as index; accumulation with repeated targets
    Shape ss = is;
    for (auto& x : ss) x += g.integer(0, 1);
    RT rsrc;
    Tensor<B> bsrc;
    g.make_pair(ss, d, g.pick(kLayouts), rsrc, bsrc);
    // Each target receives at most is[a] additions, each rounded to the storage type. Reference, Cpu
    // and Cuda all add in index order (Cuda equals Cpu bit for bit: tests/cuda/test_cuda_scatter.cpp),
    // but the contract allows a backend any order: two orders differ by at most
    // 2 (count + 1) u (|x| + sum|src|) per element, u the storage type's roundoff (f32's for bf16/f16
    // would hold only for one fixed order).
    const double u_add = std::max(u_acc(d), u_store(d));
    std::vector<double> bound;
    if (kiln::is_floating(d)) {
      bound = host(rx.abs().to(DType::f64).scatter_add(a, ri, rsrc.abs().to(DType::f64)));
      for (auto& b : bound) b *= 2.0 * static_cast<double>(is[ua] + 1) * u_add;
    } else {
      bound.assign(static_cast<size_t>(numel(s)), 0.0);
    }
    check_close(bx.scatter_add(a, bi, bsrc), rx.scatter_add(a, ri, rsrc), Tol{2 * u_store(d), 0},
                fmt::format("scatter_add {} index {} src {}", w, shape_str(is), shape_str(ss)), &bound);
    // index_add: src has the input's shape with the axis replaced by the number of indices
    Shape as = s;
    as[ua] = rsi.numel();
    RT rad;
    Tensor<B> bad;
    g.make_pair(as, d, g.pick(kLayouts), rad, bad);
    std::vector<double> bound2;
    if (kiln::is_floating(d)) {
      bound2 = host(rx.abs().to(DType::f64).index_add(a, rsi, rad.abs().to(DType::f64)));
      for (auto& b : bound2) b *= 2.0 * static_cast<double>(rsi.numel() + 1) * u_add;
    } else {
      bound2.assign(static_cast<size_t>(numel(s)), 0.0);
    }
    check_close(bx.index_add(a, bsi, bad), rx.index_add(a, rsi, rad), Tol{2 * u_store(d), 0},
                fmt::format("index_add {} src {}", w, shape_str(as)), &bound2);
  }
}

TEMPLATE_TEST_CASE("indexing: hand-computed values (PyTorch semantics)", "[core][index]", KILN_TEST_BACKENDS) {
  using B = TestType;
  const auto x = tensor<B>({{1.f, 2.f, 3.f}, {4.f, 5.f, 6.f}});
  // torch.gather(x, 1, [[2, 0], [1, 1]]) = [[3, 1], [5, 5]]
  const auto i = Tensor<B>::from_vector(std::vector<int64_t>{2, 0, 1, 1}, {2, 2});
  CHECK(to_vector<float>(x.gather(1, i)) == std::vector<float>{3, 1, 5, 5});
  // torch.gather(x, 0, [[1, 0, 1]]) = [[4, 2, 6]]
  CHECK(to_vector<float>(x.gather(0, Tensor<B>::from_vector(std::vector<int32_t>{1, 0, 1}, {1, 3}))) == std::vector<float>{4, 2, 6});
  // index_select with repeats
  CHECK(to_vector<float>(x.index_select(1, Tensor<B>::from_vector(std::vector<int64_t>{2, 2, 0}))) == std::vector<float>{3, 3, 1, 6, 6, 4});
  // scatter_add with repeated targets: zeros(2, 3).scatter_add(1, [[0, 0, 2], [1, 1, 1]], ones) =
  // [[2, 0, 1], [0, 3, 0]]
  const auto si = Tensor<B>::from_vector(std::vector<int64_t>{0, 0, 2, 1, 1, 1}, {2, 3});
  CHECK(to_vector<float>(Tensor<B>::zeros({2, 3}).scatter_add(1, si, Tensor<B>::ones({2, 3}))) == std::vector<float>{2, 0, 1, 0, 3, 0});
  // the input is not modified (out-of-place)
  const auto z = Tensor<B>::zeros({2, 3});
  (void)z.scatter_add(1, si, Tensor<B>::ones({2, 3}));
  CHECK(to_vector<float>(z) == std::vector<float>(6, 0.f));
  // index_add with a repeated index: rows 0 and 0 and 1
  const auto ia = Tensor<B>::zeros({2, 2}).index_add(0, Tensor<B>::from_vector(std::vector<int64_t>{0, 0, 1}),
                                                     tensor<B>({{1.f, 2.f}, {10.f, 20.f}, {100.f, 200.f}}));
  CHECK(to_vector<float>(ia) == std::vector<float>{11, 22, 100, 200});
  // integer scatter_add is exact
  CHECK(to_vector<int64_t>(Tensor<B>::zeros({3}, DType::i64)
                               .scatter_add(0, Tensor<B>::from_vector(std::vector<int64_t>{2, 2, 2}),
                                            Tensor<B>::full({3}, 1000000000000LL, DType::i64))) ==
        std::vector<int64_t>{0, 0, 3000000000000LL});
}
