// The fused RoPE (core/fused_rope.hpp): each backend against the composite on Reference (slices, muls,
// stack, in float64) on random shapes, strided inputs and table offsets, float64 finite differences of
// the recorded op nn::rope, and its errors.
#include <catch2/catch.hpp>

#include <kiln/autograd/gradcheck.hpp>
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
}
