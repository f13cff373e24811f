// The fused SwiGLU gating (core/fused_swiglu.hpp): each backend against the composite on Reference
// (silu and mul from tensor ops, in float64) on random shapes, float64 finite differences of the
// recorded op, and the SwiGLU module against its definition down(silu(gate(x)) ⊙ up(x)).
#include <catch2/catch.hpp>

#include <map>

#include <kiln/autograd/gradcheck.hpp>
#include <kiln/backends/backends.hpp>
#include <kiln/core/fused_swiglu.hpp>
#include <kiln/nn/layers.hpp>
#include "common/kiln_test.hpp"

using namespace kiln;

namespace {

// f32: four rounded factors and the vector sigmoid's few ulp; the absolute part covers the cancellation
// in 1 + a·(1 − s) near a ≈ −1.28. bf16: the f32 result rounded once. f64: the same formula in doubles.
kt::Tol swiglu_tol(DType d) {
  if (d == DType::f32) return {2e-6, 2e-6};
  if (d == DType::f64) return {1e-13, 1e-13};
  return kt::elementwise_tol(d);
}

}  // namespace

static_assert(fused::HasSwiGLU<Cpu>, "the Cpu backend has the fused SwiGLU kernel");

TEMPLATE_TEST_CASE("fused swiglu: forward and both gradients equal the float64 composite on random shapes", "[swiglu][fused]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  Generator gen(17);
  for (DType d : {DType::f32, DType::f64, DType::bf16})
    for (const Shape& s : {Shape{0}, Shape{1}, Shape{7}, Shape{3, 259}, Shape{2, 5, 704}, Shape{1031, 17}}) {
      INFO("shape " << shape_str(s) << " dtype " << dtype_name(d));
      // The inputs are rounded to d first, so both sides see the same values.
      const Tensor<Reference> a = Tensor<Reference>::randn(s, DType::f64, &gen).mul(4.0).to(d).to(DType::f64);
      const Tensor<Reference> b = Tensor<Reference>::randn(s, DType::f64, &gen).to(d).to(DType::f64);
      const Tensor<Reference> g = Tensor<Reference>::randn(s, DType::f64, &gen).to(d).to(DType::f64);
      const Tensor<Reference> ry = fused::swiglu_forward(a, b);
      const auto [rda, rdb] = fused::swiglu_backward(a, b, g);
      const Tensor<B> ba = a.to(d).to<B>(), bb = b.to(d).to<B>(), bg = g.to(d).to<B>();
      const Tensor<B> y = fused::swiglu_forward(ba, bb);
      const auto [da, db] = fused::swiglu_backward(ba, bb, bg);
      kt::check_close(y, ry.to(d), swiglu_tol(d), "y");
      kt::check_close(da, rda.to(d), swiglu_tol(d), "d gate");
      kt::check_close(db, rdb.to(d), swiglu_tol(d), "d up");
    }
}

TEMPLATE_TEST_CASE("fused swiglu: non-contiguous inputs, bad shapes and dtypes", "[swiglu][fused]", KILN_BACKEND_TYPES) {
  using B = TestType;
  Generator gen(3);
  const Tensor<B> a = Tensor<B>::randn({6, 4}, DType::f32, &gen), b = Tensor<B>::randn({4, 6}, DType::f32, &gen);
  const Tensor<B> want = a.t().contiguous().silu().mul(b);
  const std::vector<float> got = to_vector<float>(fused::swiglu_forward(a.t(), b)), w = to_vector<float>(want);
  for (size_t i = 0; i < w.size(); ++i) CHECK(got[i] == Approx(w[i]).margin(1e-6));
  CHECK_THROWS_WITH(fused::swiglu_forward(a, b), Catch::Contains("swiglu: gate [6, 4] and up [4, 6] must have one shape"));
  CHECK_THROWS_WITH(fused::swiglu_forward(a, a.to(DType::f64)), Catch::Contains("swiglu: needs one float dtype"));
  CHECK_THROWS_WITH(fused::swiglu_forward(a.to(DType::i32), a.to(DType::i32)), Catch::Contains("swiglu: needs one float dtype"));
  CHECK_THROWS_WITH(fused::swiglu_backward(a, a, b), Catch::Contains("swiglu_backward: dy [4, 6] differs"));
}

TEMPLATE_TEST_CASE("fused swiglu: nn::functional::swiglu and the SwiGLU module pass float64 finite differences",
                   "[swiglu][fused][gradcheck]", KILN_BACKEND_TYPES) {
  using B = TestType;
  Generator gen(8);
  const Tensor<B> a = Tensor<B>::randn({3, 2, 9}, DType::f64, &gen).mul(3.0), b = Tensor<B>::randn({3, 2, 9}, DType::f64, &gen);
  const auto r = gradcheck<B>([](const std::vector<Var<B>>& in) { return nn::functional::swiglu(in[0], in[1]); }, {a, b});
  INFO(r.message);
  CHECK(r.ok);
  nn::SwiGLU<B> m({.dim = 5, .hidden = 7, .dtype = DType::f64});
  const Tensor<B> x = Tensor<B>::randn({2, 3, 5}, DType::f64, &gen);
  const auto rm = gradcheck<B>([&](const std::vector<Var<B>>& in) { return m.forward(in[0]); }, {x});
  INFO(rm.message);
  CHECK(rm.ok);
  // The module is down(silu(gate x) ⊙ up x), as composite ops.
  const auto named = m.named_parameters();
  const std::map<std::string, Var<B>> params(named.begin(), named.end());
  const Var<B> X(x), composite = (X.matmul(params.at("gate_proj.weight").t()).silu() * X.matmul(params.at("up_proj.weight").t()))
                                     .matmul(params.at("down_proj.weight").t());
  const std::vector<double> want = to_vector<double>(composite.value()), got = to_vector<double>(m.forward(X).value());
  for (size_t i = 0; i < want.size(); ++i) CHECK(got[i] == Approx(want[i]).epsilon(1e-12).margin(1e-14));
}

// The backward the autograd op runs (core/fused_swiglu.hpp, swiglu_backward_reusing) writes its results
// over a and b when the caller gives them up, else over dy when dy alone holds its memory: the same bits
// as swiglu_backward in every placement, and a dy held elsewhere (shared, or strided) is never written.
TEST_CASE("fused swiglu: the backward over given-up inputs or an unshared dy gives the same bits", "[swiglu][fused]") {
  Generator gen(29);
  for (DType d : {DType::f32, DType::f64}) {
    INFO("dtype " << dtype_name(d));
    const Tensor<Cpu> a0 = Tensor<Cpu>::randn({2, 5, 704}, d, &gen).mul(4.0), b0 = Tensor<Cpu>::randn({2, 5, 704}, d, &gen);
    const Tensor<Cpu> g = Tensor<Cpu>::randn({2, 5, 704}, d, &gen);
    const auto [wda, wdb] = fused::swiglu_backward(a0, b0, g);
    for (int a_free = 0; a_free < 2; ++a_free)
      for (int b_free = 0; b_free < 2; ++b_free)
        for (int shared = 0; shared < 2; ++shared) {
          INFO("a given up " << a_free << ", b given up " << b_free << ", dy shared " << shared);
          const Tensor<Cpu> a = a0.clone(), b = b0.clone(), dy = g.clone();
          Tensor<Cpu> other;
          if (shared) other = dy;
          const auto [da, db] = fused::swiglu_backward_reusing(a, b, dy, a_free != 0, b_free != 0);
          kt::check_bits(da, wda, "d gate");
          kt::check_bits(db, wdb, "d up");
          CHECK((da.storage() == a.storage()) == (a_free != 0));
          CHECK((db.storage() == b.storage()) == (b_free != 0));
          // dy goes to the first result without a place of its own, only when nothing else holds it.
          const bool dy_used = !shared && !(a_free && b_free);
          CHECK((da.storage() == dy.storage() || db.storage() == dy.storage()) == dy_used);
          if (!a_free) kt::check_bits(a, a0, "a kept");
          if (!b_free) kt::check_bits(b, b0, "b kept");
          if (shared) kt::check_bits(other, g, "the shared dy");
        }
  }
  // A strided dy (alone) is not written either, and the gate and up may be strided.
  const Tensor<Cpu> a = Tensor<Cpu>::randn({9, 6}, DType::f32, &gen), b = Tensor<Cpu>::randn({6, 9}, DType::f32, &gen).t();
  const Tensor<Cpu> dy = Tensor<Cpu>::randn({6, 9}, DType::f32, &gen).t(), keep = dy.clone();
  const auto [wda, wdb] = fused::swiglu_backward(a, b.contiguous(), dy.contiguous());
  const auto [da, db] = fused::swiglu_backward_reusing(a, b, dy, false, true);
  CHECK(db.storage() != dy.storage());
  CHECK(db.storage() != b.storage());  // strided: not a place for db
  kt::check_bits(dy, keep, "the strided dy");
  kt::check_bits(da, wda, "d gate (strided)");
  kt::check_bits(db, wdb, "d up (strided)");
}

// The recorded op in a Linear-like graph (x @ W, reshaped, as nn::Linear) gives the same gradient bits
// whether it may overwrite the gate and up (nothing else holds them) or not (the caller keeps their
// Vars, whose values must then survive), and a gradient passed to backward() survives too.
TEST_CASE("fused swiglu: the recorded op gives the same bits in place or not and leaves what the caller holds intact", "[swiglu][fused]") {
  Generator gen(31);
  const Tensor<Cpu> x = Tensor<Cpu>::randn({3, 4, 16}, DType::f32, &gen), w = Tensor<Cpu>::randn({3, 4, 40}, DType::f32, &gen);
  const Tensor<Cpu> wg = Tensor<Cpu>::randn({16, 40}, DType::f32, &gen).mul(0.5), wu = Tensor<Cpu>::randn({16, 40}, DType::f32, &gen);
  struct Grads {
    Tensor<Cpu> x, wg, wu;
  };
  const auto run = [&](bool hold, bool seed) {
    Var<Cpu> X(x, true), WG(wg, true), WU(wu, true);
    Var<Cpu> gate = X.reshape({12, 16}).matmul(WG).reshape({3, 4, 40}), up = X.reshape({12, 16}).matmul(WU).reshape({3, 4, 40});
    const Tensor<Cpu> gate0 = gate.value().clone(), up0 = up.value().clone();
    Var<Cpu> y = nn::functional::swiglu(gate, up);
    if (!hold) {  // the graph alone holds them now
      gate = Var<Cpu>();
      up = Var<Cpu>();
    }
    if (seed) {
      const Tensor<Cpu> s = w.clone();
      y.backward(s);
      kt::check_bits(s, w, "the caller's gradient");
    } else {
      (y * Var<Cpu>(w)).sum().backward();
    }
    if (hold) {
      kt::check_bits(gate.value(), gate0, "the held gate");
      kt::check_bits(up.value(), up0, "the held up");
    }
    return Grads{X.grad(), WG.grad(), WU.grad()};
  };
  for (int seed = 0; seed < 2; ++seed) {
    INFO("seeded backward " << seed);
    const Grads held = run(true, seed != 0), free = run(false, seed != 0);
    kt::check_bits(free.x, held.x, "x grad");
    kt::check_bits(free.wg, held.wg, "gate weight grad");
    kt::check_bits(free.wu, held.wu, "up weight grad");
  }
}
