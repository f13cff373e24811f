// The fused RoPE (core/fused_rope.hpp): each backend against the composite on Reference (slices, muls,
// stack, in float64) on random shapes, strided inputs and table offsets, float64 finite differences of
// the recorded op nn::rope, and its errors.
#include <catch2/catch.hpp>

#include <kiln/autograd/gradcheck.hpp>
#include <kiln/autograd/layer_ops.hpp>
#include <kiln/backends/backends.hpp>
#include <kiln/core/fused_rope.hpp>
#include <kiln/nn/attention.hpp>
#include "common/kiln_test.hpp"

using namespace kiln;

namespace {

// Each output is x0·c ∓ x1·s with |c|, |s| <= 1: f32 rounds two products and a sum (or one FMA), a few
// ulp of |x| (randn, below ~5); bf16: the f32 result rounded once; f64: the same in doubles.
kt::Tol rope_tol(DType d) {
  if (d == DType::f32) return {2e-6, 2e-6};
  if (d == DType::f64) return {1e-14, 1e-14};
  return kt::elementwise_tol(d);
}

}  // namespace

static_assert(fused::HasRope<Cpu>, "the Cpu backend has the fused RoPE kernel");

TEMPLATE_TEST_CASE("fused rope: forward and backward equal the float64 composite on random shapes, strides and offsets", "[rope][fused]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  Generator gen(29);
  // x is built as [lead..., d] and viewed as [..., T, d]; `swap` reads it through transpose(1, 2) (the
  // attention's [B, H, T, hd] view of [B, T, H, hd]); `pos0` takes the tables as rows pos0.. of longer ones.
  struct Case {
    Shape shape;
    bool swap;
    int64_t pos0;
  };
  for (DType d : {DType::f32, DType::f64, DType::bf16})
    for (const Case& cs : {Case{{1, 2}, false, 0}, Case{{3, 5, 6}, false, 2}, Case{{2, 3, 7, 10}, false, 0}, Case{{3, 7, 5, 8}, true, 4},
                           Case{{1, 1, 1, 64}, false, 9}, Case{{0, 4, 8}, false, 0}, Case{{5, 33, 3, 64}, true, 1},
                           Case{{4, 300, 2, 64}, true, 3}}) {  // the last spans several threads' row blocks
      const Shape& s = cs.shape;
      INFO("shape " << shape_str(s) << (cs.swap ? " transposed" : "") << " pos0 " << cs.pos0 << " dtype " << dtype_name(d));
      const int64_t dw = s.back(), T = cs.swap ? s[1] : s[s.size() - 2];
      // The inputs are rounded to d first, so both sides see the same values.
      const auto rounded = [&](const Tensor<Reference>& t) { return t.to(d).to(DType::f64); };
      Tensor<Reference> x = rounded(Tensor<Reference>::randn(s, DType::f64, &gen));
      Tensor<Reference> g = rounded(Tensor<Reference>::randn(s, DType::f64, &gen));
      const Tensor<Reference> ang = Tensor<Reference>::uniform({cs.pos0 + T, dw / 2}, -4.0, 4.0, DType::f64, &gen);
      const Tensor<Reference> c = rounded(ang.cos()).narrow(0, cs.pos0, T), sn = rounded(ang.sin()).narrow(0, cs.pos0, T);
      Tensor<B> bx = x.to(d).to<B>(), bg = g.to(d).to<B>();
      if (cs.swap) {
        x = x.transpose(1, 2);
        g = g.transpose(1, 2);
        bx = bx.transpose(1, 2);
        bg = bg.transpose(1, 2);
      }
      const Tensor<B> bc = rounded(ang.cos()).to(d).template to<B>().narrow(0, cs.pos0, T),
                      bs = rounded(ang.sin()).to(d).template to<B>().narrow(0, cs.pos0, T);
      kt::check_close(fused::rope_forward(bx, bc, bs), fused::rope_forward(x, c, sn).to(d), rope_tol(d), "y");
      kt::check_close(fused::rope_backward(bg, bc, bs), fused::rope_backward(g, c, sn).to(d), rope_tol(d), "dx");
      Tensor<B> gi = bg.empty_like_layout(bg.shape(), bg.dtype());  // in place, in the gradient's layout
      gi.copy_(bg);
      kt::check_close(fused::rope_backward_(gi, bc, bs), fused::rope_backward(g, c, sn).to(d), rope_tol(d), "dx in place");
      if (fused::HasRope<B> && cs.swap && d != DType::bf16) {  // the kernel's output keeps the input's memory order
        CHECK(fused::rope_forward(bx, bc, bs).transpose(1, 2).is_contiguous());
        CHECK(fused::rope_backward(bg, bc, bs).transpose(1, 2).is_contiguous());
      }
    }
}

TEMPLATE_TEST_CASE("fused rope: the turn is the interleaved (GPT-J) pair rotation and the backward turns it back", "[rope][fused]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  // One position, pairs (1, 2) and (3, 4) by 90° and 180°: (−2, 1) and (−3, −4).
  const Tensor<B> x = Tensor<B>::from_vector(std::vector<double>{1, 2, 3, 4}, {1, 4});
  const Tensor<B> c = Tensor<B>::from_vector(std::vector<double>{0, -1}, {1, 2}),
                  s = Tensor<B>::from_vector(std::vector<double>{1, 0}, {1, 2});
  CHECK(to_vector<double>(fused::rope_forward(x, c, s)) == std::vector<double>{-2, 1, -3, -4});
  CHECK(to_vector<double>(fused::rope_backward(fused::rope_forward(x, c, s), c, s)) == std::vector<double>{1, 2, 3, 4});
}

TEMPLATE_TEST_CASE("fused rope: nn::rope passes float64 finite differences", "[rope][fused][gradcheck]", KILN_BACKEND_TYPES) {
  using B = TestType;
  Generator gen(5);
  const nn::RopeTable<B> table;
  for (int64_t pos0 : {0, 3}) {
    const Tensor<B> x = Tensor<B>::randn({2, 3, 5, 6}, DType::f64, &gen);
    const auto r = gradcheck<B>([&](const std::vector<Var<B>>& in) { return nn::rope(in[0], pos0, 100.0, &table); }, {x});
    INFO(r.message);
    CHECK(r.ok);
    // through a transposed view, as attention calls it
    const auto rt = gradcheck<B>([&](const std::vector<Var<B>>& in) { return nn::rope(in[0].transpose(1, 2), pos0, 100.0); }, {x});
    INFO(rt.message);
    CHECK(rt.ok);
  }
}

TEMPLATE_TEST_CASE("fused rope: odd widths, table shapes and dtypes are errors naming rope and the shapes", "[rope][fused]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  const Tensor<B> x = Tensor<B>::zeros({2, 3, 4}), c = Tensor<B>::zeros({3, 2});
  CHECK_THROWS_WITH(fused::rope_forward(Tensor<B>::zeros({2, 3, 5}), c, c),
                    Catch::Contains("rope: width 5 must be even (input [2, 3, 5])"));
  CHECK_THROWS_WITH(fused::rope_forward(x, Tensor<B>::zeros({4, 2}), c),
                    Catch::Contains("rope: cos [4, 2] and sin [3, 2] must be [T, d/2] = [3, 2] for input [2, 3, 4]"));
  CHECK_THROWS_WITH(fused::rope_backward(x, c, Tensor<B>::zeros({3, 4})),
                    Catch::Contains("rope_backward: cos [3, 2] and sin [3, 4] must be [T, d/2]"));
  CHECK_THROWS_WITH(fused::rope_forward(Tensor<B>::zeros({4}), c, c), Catch::Contains("rope: input [4] must be [..., T, d]"));
  CHECK_THROWS_WITH(fused::rope_forward(x.to(DType::i32), c, c), Catch::Contains("rope: needs float dtypes"));
  CHECK_THROWS_WITH(nn::rope(Var<B>(Tensor<B>::zeros({2, 3, 5})), 0, 10000.0), Catch::Contains("rope: width 5 must be even"));
  Tensor<B> shared = Tensor<B>::zeros({1, 3, 4}).expand({2, 3, 4});  // two rows on one memory
  CHECK_THROWS_WITH(fused::rope_backward_(shared, c, c),
                    Catch::Contains("rope_backward_: the gradient [2, 3, 4] (strides [0, 4, 1]) has elements sharing memory"));
}

namespace {

// The Cpu kernel's arithmetic, element by element, as the compiler contracts the scalar formula and the
// AVX2 / AVX-512 variants spell it (backends/cpu/rope.cpp): the first product of each output fused
// with the rounded second one. `fused` false: both products rounded (no FMA: the baseline kernels of a
// portable build). volatile keeps this file's compiler from contracting the rounded products itself.
template <class T> T rope_fma(T a, T b, T rounded, bool fused) {
  if (fused) return std::fma(a, b, rounded);
  volatile T p = a * b;
  return p + rounded;
}
template <class T> std::vector<T> rope_expected(const std::vector<T>& x, const std::vector<T>& c, const std::vector<T>& s, int64_t T_,
                                                int64_t d, bool inverse, bool fused) {
  std::vector<T> y(x.size());
  const int64_t h = d / 2, rows = static_cast<int64_t>(x.size()) / d;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < h; ++k) {
      const auto i = static_cast<size_t>(r * d + 2 * k), t = static_cast<size_t>((r % T_) * h + k);
      const T x0 = x[i], x1 = x[i + 1];
      volatile T x1s = x1 * s[t], x1c = x1 * c[t], x0s = x0 * s[t];
      if (inverse) {  // x0·c + x1·s, x1·c − x0·s
        y[i] = rope_fma<T>(x0, c[t], x1s, fused);
        y[i + 1] = rope_fma<T>(x1, c[t], -x0s, fused);
      } else {  // x0·c − x1·s, x0·s + x1·c
        y[i] = rope_fma<T>(x0, c[t], -x1s, fused);
        y[i + 1] = rope_fma<T>(x0, s[t], x1c, fused);
      }
    }
  return y;
}

}  // namespace

TEST_CASE("fused rope: the cpu kernel gives the bits of its scalar formula on every layout, width and table offset", "[rope][fused]") {
  // The AVX2 and AVX-512 variants fuse exactly the products the compiler fuses in the scalar loop, so
  // a run's results do not depend on KILN_CPU_ISA (the plain run takes the best ISA, ctest's
  // isa-baseline: run the baseline; KILN_CPU_ISA=avx2 by hand). Layouts: attention's [B, H, T, hd]
  // view of [B, T, H, hd]; a decoding step (T = 1, tables from position 37 on); rows narrowed out of
  // wider ones (odd row stride, unaligned start); T outermost in memory ([T, B, H, d] seen as
  // [B, H, T, d]); plain [T, d]; an expanded head axis (stride 0; in place, an error). Widths from 2
  // (no full vector) through 80 (a 16-lane vector and a tail) to 128.
  const std::string isa(cpu_isa());
  Generator gen(41);
  for (DType dt : {DType::f32, DType::f64})
    for (int64_t d : {2, 4, 6, 14, 16, 24, 32, 64, 80, 128})
      for (const char* layout : {"attention", "decode", "narrowed", "t-outer", "plain", "expanded"}) {
        const std::string l(layout);
        const int64_t T = l == "decode" ? 1 : 7, pos0 = l == "decode" ? 37 : (l == "plain" ? 3 : 0);
        INFO("layout " << l << " width " << d << " dtype " << dtype_name(dt) << " isa " << isa);
        Tensor<Cpu> x;
        if (l == "attention" || l == "decode")
          x = Tensor<Cpu>::randn({2, T, 3, d}, dt, &gen).transpose(1, 2);
        else if (l == "narrowed")
          x = Tensor<Cpu>::randn({2, 3, T, d + 5}, dt, &gen).narrow(-1, 3, d);
        else if (l == "expanded")  // one row of heads read three times (stride 0)
          x = Tensor<Cpu>::randn({2, 1, T, d}, dt, &gen).expand({2, 3, T, d});
        else if (l == "t-outer")
          x = Tensor<Cpu>::randn({T, 2, 3, d}, dt, &gen).permute({1, 2, 0, 3});
        else
          x = Tensor<Cpu>::randn({T, d}, dt, &gen);
        const Tensor<Cpu> ang = Tensor<Cpu>::uniform({pos0 + T, d / 2}, -4.0, 4.0, dt, &gen);
        const Tensor<Cpu> c = ang.cos().narrow(0, pos0, T), s = ang.sin().narrow(0, pos0, T);
        const auto check = [&]<class T_>(type_tag<T_>) {
          const std::vector<T_> xv = to_vector<T_>(x), cv = to_vector<T_>(c), sv = to_vector<T_>(s);
          for (bool inverse : {false, true}) {
            INFO((inverse ? "backward" : "forward"));
            const Tensor<Cpu> y = inverse ? fused::rope_backward(x, c, s) : fused::rope_forward(x, c, s);
            const std::vector<T_> got = to_vector<T_>(y);
            const std::vector<T_> fused_form = rope_expected(xv, cv, sv, T, d, inverse, true);
            if (isa == "baseline" && got != fused_form)  // a portable build's baseline kernels have no FMA
              CHECK(got == rope_expected(xv, cv, sv, T, d, inverse, false));
            else
              CHECK(got == fused_form);
          }
        };
        const auto check_in_place = [&]<class T_>(type_tag<T_>) {  // last: x itself becomes dx
          if (l == "expanded") {
            CHECK_THROWS_WITH(fused::rope_backward_(x, c, s), Catch::Contains("has elements sharing memory"));
            return;
          }
          const std::vector<T_> xv = to_vector<T_>(x), cv = to_vector<T_>(c), sv = to_vector<T_>(s);
          const Tensor<Cpu> whole(x.storage(), Layout({static_cast<int64_t>(x.storage()->bytes() / sizeof(T_))}), dt);
          std::vector<T_> want_whole = to_vector<T_>(whole);  // the storage after: x's elements turned, the rest as they were
          const std::vector<T_> fused_form = rope_expected(xv, cv, sv, T, d, true, true);
          fused::rope_backward_(x, c, s);
          const std::vector<T_> got = to_vector<T_>(x);
          const std::vector<T_>& want = isa == "baseline" && got != fused_form ? rope_expected(xv, cv, sv, T, d, true, false) : fused_form;
          CHECK(got == want);
          Shape idx(x.shape().size(), 0);  // x's elements in logical order, placed by its strides
          for (size_t e = 0; e < want.size(); ++e) {
            int64_t at = x.offset();
            for (size_t a = 0; a < idx.size(); ++a) at += idx[a] * x.strides()[a];
            want_whole[static_cast<size_t>(at)] = want[e];
            for (size_t a = idx.size(); a-- > 0 && ++idx[a] == x.shape()[a];) idx[a] = 0;
          }
          CHECK(to_vector<T_>(whole) == want_whole);  // nothing beside x's elements (a narrowed row's neighbours) written
        };
        if (dt == DType::f32) {
          check(type_tag<float>{});
          check_in_place(type_tag<float>{});
        } else {
          check(type_tag<double>{});
          check_in_place(type_tag<double>{});
        }
      }
}

TEMPLATE_TEST_CASE("fused rope: the backward turns its incoming gradient in place only when nothing else holds it", "[rope][fused]",
                   KILN_BACKEND_TYPES) {
  // autograd/ops/rope.cpp writes dx over dy when the pass holds the only handle on dy's storage: a
  // gradient the caller passed in (y.backward(gy)) must stay as it was, an expanded one (sum's ones,
  // stride 0) takes the out-of-place path, a fresh one (mul's) the in-place one; all give the bits
  // of rope_backward on the same backend.
  using B = TestType;
  Generator gen(43);
  const Tensor<B> base = Tensor<B>::randn({2, 6, 3, 16}, DType::f32, &gen);  // [B, T, H, hd], seen as [B, H, T, hd]
  const Tensor<B> ang = Tensor<B>::uniform({6, 8}, -4.0, 4.0, DType::f32, &gen);
  const Tensor<B> c = ang.cos(), s = ang.sin();
  const Tensor<B> gy = Tensor<B>::randn({2, 3, 6, 16}, DType::f32, &gen);
  const std::vector<float> gy_before = to_vector<float>(gy);
  const auto turn = [&](const Var<B>& x) { return autograd::RopeOps<B>::rope(x.transpose(1, 2), c, s); };
  {
    const Var<B> x(base, true);
    turn(x).backward(gy);
    CHECK(to_vector<float>(gy) == gy_before);
    CHECK(to_vector<float>(x.grad()) == to_vector<float>(fused::rope_backward(gy, c, s).transpose(1, 2)));
  }
  {
    const Var<B> x(base, true);
    turn(x).sum().backward();
    CHECK(to_vector<float>(x.grad()) == to_vector<float>(fused::rope_backward(Tensor<B>::ones({2, 3, 6, 16}), c, s).transpose(1, 2)));
  }
  {
    const Var<B> x(base, true), w(gy);
    turn(x).mul(w).sum().backward();
    CHECK(to_vector<float>(gy) == gy_before);
    CHECK(to_vector<float>(x.grad()) == to_vector<float>(fused::rope_backward(gy, c, s).transpose(1, 2)));
  }
}
