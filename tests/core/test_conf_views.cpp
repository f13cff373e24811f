// Conformance: factories, views (checked against host index arithmetic, independent of any backend),
// contiguous/clone through the backend's strided copy, element access, backend transfer, printing.
#include "common/kiln_test.hpp"

using namespace kiln;
using namespace kt;

namespace {

// Row-major host array: the independent model the view ops are checked against.
struct Host {
  Shape shape;
  std::vector<double> v;
  double at(const std::vector<int64_t>& idx) const {
    int64_t off = 0;
    for (size_t d = 0; d < shape.size(); ++d) off = off * shape[d] + idx[d];
    return v[static_cast<size_t>(off)];
  }
};
std::vector<int64_t> unravel(int64_t i, const Shape& s) {
  std::vector<int64_t> idx(s.size());
  for (size_t d = s.size(); d-- > 0;) {
    idx[d] = i % s[d];
    i /= s[d];
  }
  return idx;
}
// Expected values of a view of `h` with shape `out` where element idx comes from h.at(map(idx)).
template <class F> std::vector<double> expect(const Shape& out, F&& map) {
  std::vector<double> r(static_cast<size_t>(numel(out)));
  for (int64_t i = 0; i < numel(out); ++i) r[static_cast<size_t>(i)] = map(unravel(i, out));
  return r;
}

}  // namespace

TEMPLATE_TEST_CASE("conformance: factories", "[core][conformance]", KILN_TEST_BACKENDS) {
  using B = TestType;
  Gen g(11);
  for (int it = 0; it < 20; ++it) {
    const Shape s = g.shape(0, 4, 5);
    for (DType d : kAllDTypes) {
      const std::string w = describe(s, d, Lay::contiguous);
      check_equal(Tensor<B>::zeros(s, d), RT::zeros(s, d), "zeros " + w);
      check_equal(Tensor<B>::ones(s, d), RT::ones(s, d), "ones " + w);
      check_equal(Tensor<B>::full(s, 3, d), RT::full(s, 3, d), "full " + w);
      // independent: every element is the value
      const auto f = host(Tensor<B>::full(s, Scalar(-2.5), d));
      const double want = d == DType::boolean ? 1.0 : kiln::is_integral(d) ? -2.0 : -2.5;
      CHECK(std::all_of(f.begin(), f.end(), [&](double x) { return x == want; }));
      CHECK(Tensor<B>::zeros(s, d).is_contiguous());
    }
  }
  // arange like torch.arange: [start, end) by step
  CHECK(host(Tensor<B>::arange(5)) == std::vector<double>{0, 1, 2, 3, 4});
  CHECK(Tensor<B>::arange(5).dtype() == DType::i64);
  CHECK(host(Tensor<B>::arange(1.0, 2.0, 0.25, DType::f32)) == std::vector<double>{1, 1.25, 1.5, 1.75});
  CHECK(host(Tensor<B>::arange(5.0, 0.0, -2.0, DType::i32)) == std::vector<double>{5, 3, 1});
  CHECK(host(Tensor<B>::arange(0.0, 1.0, 0.3, DType::f64)) == std::vector<double>{0, 0.3, 0.6, 0.8999999999999999});
  CHECK(Tensor<B>::arange(0).numel() == 0);
  // from_vector / from / from_blob keep values and dtype
  const auto t = tensor<B>({{1.5f, -2.f, 3.f}, {4.f, 5.f, 6.25f}});
  CHECK(t.shape() == Shape{2, 3});
  CHECK(host(t) == std::vector<double>{1.5, -2, 3, 4, 5, 6.25});
  CHECK(Tensor<B>::from_vector(std::vector<int32_t>{1, -2}).dtype() == DType::i32);
  CHECK(Tensor<B>::from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {3, 2}).template at<double>({2, 1}) == 6.0);
  const int64_t raw[3] = {7, 8, 9};
  CHECK(host(Tensor<B>::from_blob(raw, {3}, DType::i64)) == std::vector<double>{7, 8, 9});
  CHECK(host(Tensor<B>::scalar(4.5)) == std::vector<double>{4.5});
  CHECK(Tensor<B>::scalar(4.5).dim() == 0);
  const auto e = Tensor<B>::zeros({2, 3}, DType::f16);
  CHECK((e.zeros_like().shape() == Shape{2, 3} && e.ones_like().dtype() == DType::f16 && e.empty_like().numel() == 6));
}

TEMPLATE_TEST_CASE("conformance: views match host index arithmetic", "[core][conformance][views]", KILN_TEST_BACKENDS) {
  using B = TestType;
  Gen g(22);
  for (int it = 0; it < 150; ++it) {
    const Shape s = g.shape(1, 4, 5);
    const int64_t r = static_cast<int64_t>(s.size());
    const Lay l = g.pick(kLayouts);
    RT rx;
    Tensor<B> bx;
    g.make_pair(s, DType::f32, l, rx, bx);
    const Host h{s, host(rx)};
    const std::string w = describe(s, DType::f32, l);
    auto check = [&](const Tensor<B>& got, const RT& ref, const Shape& out, const std::vector<double>& want, const std::string& op) {
      INFO(op << " of " << w);
      REQUIRE(got.shape() == out);
      CHECK(host(got) == want);  // logical values (to_vector goes through contiguous())
      CHECK(host(got.contiguous()) == want);
      CHECK(host(got.clone()) == want);
      CHECK(got.clone().is_contiguous());
      check_equal(got, ref, op);
    };
    const int64_t a = g.integer(0, r - 1), b = g.integer(0, r - 1);
    {  // permute: a random permutation
      std::vector<int64_t> p(static_cast<size_t>(r));
      std::iota(p.begin(), p.end(), 0);
      std::shuffle(p.begin(), p.end(), g.rng);
      Shape out(static_cast<size_t>(r));
      for (int64_t i = 0; i < r; ++i) out[static_cast<size_t>(i)] = s[static_cast<size_t>(p[static_cast<size_t>(i)])];
      check(bx.permute(p), rx.permute(p), out,
            expect(out,
                   [&](const std::vector<int64_t>& o) {
                     std::vector<int64_t> idx(static_cast<size_t>(r));
                     for (int64_t i = 0; i < r; ++i) idx[static_cast<size_t>(p[static_cast<size_t>(i)])] = o[static_cast<size_t>(i)];
                     return h.at(idx);
                   }),
            fmt::format("permute [{}]", fmt::join(p, ", ")));
    }
    {  // transpose (negative axis form)
      Shape out = s;
      std::swap(out[static_cast<size_t>(a)], out[static_cast<size_t>(b)]);
      check(bx.transpose(a - r, b), rx.transpose(a - r, b), out,
            expect(out,
                   [&](std::vector<int64_t> o) {
                     std::swap(o[static_cast<size_t>(a)], o[static_cast<size_t>(b)]);
                     return h.at(o);
                   }),
            fmt::format("transpose {} {}", a - r, b));
    }
    {  // narrow
      const int64_t n = s[static_cast<size_t>(a)];
      const int64_t start = g.integer(0, n), len = g.integer(0, n - start);
      Shape out = s;
      out[static_cast<size_t>(a)] = len;
      check(bx.narrow(a, start, len), rx.narrow(a, start, len), out,
            expect(out,
                   [&](std::vector<int64_t> o) {
                     o[static_cast<size_t>(a)] += start;
                     return h.at(o);
                   }),
            fmt::format("narrow axis {} start {} len {}", a, start, len));
    }
    {  // slice with step, python-style bounds (negative, past the end)
      const int64_t n = s[static_cast<size_t>(a)];
      const int64_t start = g.integer(-n - 2, n + 2), end = g.integer(-n - 2, n + 2), step = g.integer(1, 3);
      int64_t st = start < 0 ? start + n : start, en = end < 0 ? end + n : end;
      st = std::clamp<int64_t>(st, 0, n);
      en = std::clamp<int64_t>(en, st, n);
      Shape out = s;
      out[static_cast<size_t>(a)] = (en - st + step - 1) / step;
      check(bx.slice(a, start, end, step), rx.slice(a, start, end, step), out,
            expect(out,
                   [&](std::vector<int64_t> o) {
                     o[static_cast<size_t>(a)] = st + o[static_cast<size_t>(a)] * step;
                     return h.at(o);
                   }),
            fmt::format("slice axis {} [{}:{}:{}]", a, start, end, step));
    }
    if (s[static_cast<size_t>(a)] > 0) {  // select (also negative index)
      const int64_t n = s[static_cast<size_t>(a)];
      const int64_t i = g.integer(-n, n - 1);
      Shape out = s;
      out.erase(out.begin() + a);
      check(bx.select(a, i), rx.select(a, i), out,
            expect(out,
                   [&](std::vector<int64_t> o) {
                     o.insert(o.begin() + a, i < 0 ? i + n : i);
                     return h.at(o);
                   }),
            fmt::format("select axis {} index {}", a, i));
    }
    {  // reshape / view / flatten / squeeze / unsqueeze keep row-major order
      Shape out{numel(s)};
      if (numel(s) > 0 && numel(s) % 2 == 0 && g.coin()) out = {2, -1};
      Shape real_out = out;
      if (real_out.size() == 2) real_out[1] = numel(s) / 2;
      check(bx.reshape(out), rx.reshape(out), real_out, h.v, fmt::format("reshape {}", shape_str(out)));
      if (bx.is_contiguous()) check(bx.view(out), rx.view(out), real_out, h.v, "view of a contiguous tensor");
      const int64_t f0 = g.integer(0, r - 1), f1 = g.integer(f0, r - 1);
      Shape fo(s.begin(), s.begin() + f0);
      int64_t m = 1;
      for (int64_t i = f0; i <= f1; ++i) m *= s[static_cast<size_t>(i)];
      fo.push_back(m);
      fo.insert(fo.end(), s.begin() + f1 + 1, s.end());
      check(bx.flatten(f0, f1), rx.flatten(f0, f1), fo, h.v, fmt::format("flatten {} {}", f0, f1));
      Shape sq;
      for (int64_t d : s)
        if (d != 1) sq.push_back(d);
      check(bx.squeeze(), rx.squeeze(), sq, h.v, "squeeze");
      Shape sq1 = s;
      if (s[static_cast<size_t>(a)] == 1) sq1.erase(sq1.begin() + a);
      check(bx.squeeze(a), rx.squeeze(a), sq1, h.v, fmt::format("squeeze {}", a));
      const int64_t u = g.integer(-r - 1, r);
      Shape us = s;
      us.insert(us.begin() + (u < 0 ? u + r + 1 : u), 1);
      check(bx.unsqueeze(u), rx.unsqueeze(u), us, h.v, fmt::format("unsqueeze {}", u));
    }
    {  // expand: size-1 dims (made by narrowing to 1) grow, plus a new leading dim
      const RT r1 = rx.narrow(a, 0, std::min<int64_t>(1, s[static_cast<size_t>(a)]));
      const Tensor<B> b1 = bx.narrow(a, 0, std::min<int64_t>(1, s[static_cast<size_t>(a)]));
      const Host h1{r1.shape(), host(r1)};
      Shape out = r1.shape();
      if (out[static_cast<size_t>(a)] == 1) out[static_cast<size_t>(a)] = g.integer(0, 4);
      out.insert(out.begin(), g.integer(1, 3));
      Shape tgt = out;
      tgt[static_cast<size_t>(a) + 1] =
          g.coin() && r1.shape()[static_cast<size_t>(a)] == out[static_cast<size_t>(a) + 1] ? -1 : tgt[static_cast<size_t>(a) + 1];
      const Tensor<B> eb = b1.expand(tgt);
      check(eb, r1.expand(tgt), out,
            expect(out,
                   [&](std::vector<int64_t> o) {
                     o.erase(o.begin());
                     for (size_t d = 0; d < o.size(); ++d)
                       if (h1.shape[d] == 1) o[d] = 0;
                     return h1.at(o);
                   }),
            fmt::format("expand {} to {}", shape_str(r1.shape()), shape_str(tgt)));
      CHECK(eb.strides()[0] == 0);
    }
  }
}

TEMPLATE_TEST_CASE("views share storage, reshape copies only when it must", "[core][views]", KILN_TEST_BACKENDS) {
  using B = TestType;
  auto x = Tensor<B>::arange(24, DType::f32).reshape({2, 3, 4});
  CHECK(x.storage() == Tensor<B>(x).storage());
  const auto v = x.view({4, -1});
  CHECK(v.shape() == Shape{4, 6});
  CHECK(v.storage() == x.storage());
  CHECK(x.permute({2, 0, 1}).storage() == x.storage());
  CHECK_FALSE(x.permute({2, 0, 1}).is_contiguous());
  // a transposed tensor cannot be viewed flat; reshape copies (and the copy is right)
  const auto t = x.transpose(0, 2);
  CHECK_THROWS_WITH(t.view({-1}), Catch::Contains("view") && Catch::Contains("[4, 3, 2]"));
  const auto rs = t.reshape({-1});
  CHECK(rs.storage() != x.storage());
  CHECK(rs.template at<float>({1}) == 12.f);  // t[0][0][1] = x[1][0][0]
  // splitting a dim of a permuted tensor is still a view (PyTorch computeStride semantics)
  const auto p = x.permute({1, 0, 2});  // [3, 2, 4]
  const auto pv = p.view({3, 2, 2, 2});
  CHECK(pv.storage() == x.storage());
  CHECK(host(pv) == host(p));
  // merging dims across the permutation is not
  CHECK_THROWS_AS(p.view({6, 4}), kiln::Error);
  // a view writes through
  auto base = Tensor<B>::zeros({2, 2});
  auto flat = base.view({4});
  flat.narrow(0, 3, 1).fill_(9);
  CHECK(base.template at<float>({1, 1}) == 9.f);
  // size-0 and size-1 corner cases
  CHECK(Tensor<B>::zeros({0, 3}).reshape({3, 0, 5}).shape() == Shape{3, 0, 5});
  CHECK(Tensor<B>::zeros({0, 3}).view({-1}).shape() == Shape{0});
  CHECK(Tensor<B>::scalar(2).reshape({1, 1}).shape() == Shape{1, 1});
  CHECK(Tensor<B>::scalar(2).flatten().shape() == Shape{1});
  CHECK(Tensor<B>::ones({1, 1, 1}).squeeze().dim() == 0);
  CHECK(Tensor<B>::ones({3}).t().shape() == Shape{3});
  // sole_owner: no other handle (tensor or view) on the storage
  auto own = Tensor<B>::zeros({2, 3});
  CHECK(own.sole_owner());
  {
    const auto alias = own.narrow(0, 0, 1);
    CHECK_FALSE(own.sole_owner());
    CHECK_FALSE(alias.sole_owner());
  }
  CHECK(own.sole_owner());
  CHECK_FALSE(Tensor<B>().sole_owner());
}

TEMPLATE_TEST_CASE("element access and backend transfer", "[core][conformance]", KILN_TEST_BACKENDS) {
  using B = TestType;
  Gen g(33);
  for (int it = 0; it < 30; ++it) {
    const Shape s = g.shape(0, 4, 5);
    const DType d = g.pick(kAllDTypes);
    const Lay l = g.pick(kLayouts);
    RT rx;
    Tensor<B> bx;
    g.make_pair(s, d, l, rx, bx);
    const std::string w = describe(s, d, l);
    // to<Other>() both ways keeps shape, dtype and bits (and makes contiguous copies)
    check_bits(bx.template to<Ref>(), rx, "to<Reference> " + w);
    check_bits(rx.template to<B>(), bx, "to<B> " + w);
    CHECK(rx.template to<B>().is_contiguous());
    // at() agrees with to_vector
    const auto v = host(bx);
    for (int k = 0; k < 5 && !v.empty(); ++k) {
      const int64_t i = g.integer(0, static_cast<int64_t>(v.size()) - 1);
      std::vector<int64_t> idx(s.size());
      int64_t rem = i;
      for (size_t dd = s.size(); dd-- > 0;) {
        idx[dd] = rem % s[dd];
        rem /= s[dd];
      }
      CHECK(bx.template at<double>(idx) == v[static_cast<size_t>(i)]);
    }
  }
  // item on 1-element tensors of any rank, with conversion
  CHECK(Tensor<B>::full({1, 1, 1}, 2.75, DType::f64).template item<float>() == 2.75f);
  CHECK(Tensor<B>::full({}, 7, DType::i32).template item<int64_t>() == 7);
  CHECK(Tensor<B>::arange(10, DType::i64).narrow(0, 4, 1).template item<int32_t>() == 4);
  CHECK(Tensor<B>::full({}, -2.9, DType::f32).template item<int32_t>() == -2);
  CHECK(to_vector<int32_t>(tensor<B>({{1.f, 2.f}, {3.f, 4.f}}).t()) == std::vector<int32_t>{1, 3, 2, 4});
}

TEMPLATE_TEST_CASE("printing matches PyTorch's layout", "[core][print]", KILN_TEST_BACKENDS) {
  using B = TestType;
  const std::string bk(B::name);
  // expected strings: repr(torch.tensor(...)) from PyTorch 1.13 with kiln's suffix appended
  CHECK(fmt::format("{}", tensor<B>({{1.f, 2.f}, {3.f, 4.f}})) ==
        "tensor([[1., 2.],\n        [3., 4.]], shape=[2, 2], dtype=f32, backend=" + bk + ")");
  CHECK(fmt::format("{}", tensor<B>({1.5f, -2.25f, 100.f})) ==
        "tensor([  1.5000,  -2.2500, 100.0000], shape=[3], dtype=f32, backend=" + bk + ")");
  CHECK(tensor<B>({{1, -20}, {3, 4}}).str() == "tensor([[  1, -20],\n        [  3,   4]], shape=[2, 2], dtype=i32, backend=" + bk + ")");
  CHECK(Tensor<B>::from_vector(std::vector<uint8_t>{1, 0}).str() == "tensor([ True, False], shape=[2], dtype=bool, backend=" + bk + ")");
  CHECK(Tensor<B>::scalar(3.0).str() == "tensor(3., shape=[], dtype=f32, backend=" + bk + ")");
  CHECK(Tensor<B>::from_vector(std::vector<float>{std::nanf(""), 1.5f, INFINITY}).str() ==
        "tensor([   nan, 1.5000,    inf], shape=[3], dtype=f32, backend=" + bk + ")");
  CHECK(Tensor<B>::from_vector(std::vector<float>{1e-5f, 2e-5f}).str() ==
        "tensor([1.0000e-05, 2.0000e-05], shape=[2], dtype=f32, backend=" + bk + ")");
  CHECK(Tensor<B>::from_vector(std::vector<double>{1, 2, 3, 4}, {2, 1, 2}).str() ==
        "tensor([[[1., 2.]],\n\n        [[3., 4.]]], shape=[2, 1, 2], dtype=f64, backend=" + bk + ")");
  // PyTorch switches to scientific notation when max/min of the nonzero magnitudes exceeds 1000
  // or the max exceeds 1e8, for integral-valued floats too
  CHECK(Tensor<B>::from_vector(std::vector<float>{0.001f, 10.f}).str() ==
        "tensor([1.0000e-03, 1.0000e+01], shape=[2], dtype=f32, backend=" + bk + ")");
  CHECK(Tensor<B>::from_vector(std::vector<float>{1e10f, 1.f}).str() ==
        "tensor([1.0000e+10, 1.0000e+00], shape=[2], dtype=f32, backend=" + bk + ")");
  // a strided view prints its logical values
  CHECK(tensor<B>({{1.f, 2.f}, {3.f, 4.f}}).t().str() ==
        "tensor([[1., 3.],\n        [2., 4.]], shape=[2, 2], dtype=f32, backend=" + bk + ")");
  CHECK(Tensor<B>().str() == "tensor(undefined)");
  CHECK_NOTHROW(Tensor<B>::zeros({2, 0, 3}).str());
}
