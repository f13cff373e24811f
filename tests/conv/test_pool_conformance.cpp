// Pooling conformance: every backend's max_pool2d (values, indices, backward), avg_pool2d and
// adaptive_avg_pool2d (forward, backward), and the composites, against Reference on random
// geometries (ceil_mode, padding, dilation for max, count_include_pad) and non-contiguous inputs.
// Max values and indices are exact (random continuous inputs have no ties); sums use the bound of
// conv_common.hpp.
#include <catch2/catch.hpp>

#include "conv_common.hpp"

#include <kiln/autograd/ops.hpp>

using namespace kiln;
using namespace kt;

namespace {

struct PoolCase {
  int64_t N, C, H, W;
  Pool2dParams p;
  std::string str() const {
    return fmt::format("x [{}, {}, {}, {}] kernel ({}, {}) stride ({}, {}) pad ({}, {}) dil ({}, {}) ceil {} include_pad {}", N, C, H, W,
                       p.kernel.h, p.kernel.w, p.stride.h, p.stride.w, p.padding.h, p.padding.w, p.dilation.h, p.dilation.w, p.ceil_mode,
                       p.count_include_pad);
  }
};

PoolCase random_pool(Gen& g, bool dilation) {
  PoolCase c{};
  c.p.kernel = {g.integer(1, 4), g.integer(1, 4)};
  c.p.stride = {g.integer(1, 3), g.integer(1, 3)};
  c.p.dilation = dilation ? Size2{g.integer(1, 2), g.integer(1, 2)} : Size2{1};
  const int64_t eh = c.p.dilation.h * (c.p.kernel.h - 1) + 1, ew = c.p.dilation.w * (c.p.kernel.w - 1) + 1;
  c.p.padding = {g.integer(0, c.p.kernel.h / 2), g.integer(0, c.p.kernel.w / 2)};  // PyTorch's limit: half the undilated kernel
  c.p.ceil_mode = g.coin();
  c.p.count_include_pad = g.coin();
  c.N = g.integer(1, 3);
  c.C = g.integer(1, 4);
  // at least the (dilated) kernel, so every window holds an input element
  c.H = eh + g.integer(0, 8);
  c.W = ew + g.integer(0, 8);
  return c;
}

template <Backend B> Tensor<B> absf64(const Tensor<B>& t) { return t.to(DType::f64).abs(); }

}  // namespace

TEMPLATE_TEST_CASE("max_pool2d against Reference: values, indices, backward", "[pool]", KILN_TEST_BACKENDS) {
  Gen g(21);
  for (int it = 0; it < 60; ++it) {
    const PoolCase c = random_pool(g, true);
    const DType d = it % 4 == 3 ? DType::f64 : it % 4 == 2 ? DType::bf16 : DType::f32;
    INFO(c.str() << " " << dtype_name(d) << " layout " << it % 3);
    RT xr, dyr;
    Tensor<TestType> x, dy;
    make4<TestType>(g, {c.N, c.C, c.H, c.W}, d, it % 3, xr, x);
    const auto [yr, ir] = fused::max_pool2d(xr, c.p);
    const auto [y, i] = fused::max_pool2d(x, c.p);
    check_equal(y, yr, "max_pool2d values");
    check_equal(i, ir, "max_pool2d indices");
    const auto [yc, ic] = fused::max_pool2d_composite(x, c.p);
    check_equal(yc, yr, "max_pool2d values (composite)");
    check_equal(ic, ir, "max_pool2d indices (composite)");
    make4<TestType>(g, yr.shape(), d, 0, dyr, dy);
    const Shape xs = xr.shape();
    const RT dxr = fused::max_pool2d_backward(dyr, ir, xs, c.p);
    const auto b = sum_bound(host(fused::max_pool2d_backward(absf64(dyr), ir, xs, c.p)), c.p.kernel.h * c.p.kernel.w, d);
    check_close(fused::max_pool2d_backward(dy, i, xs, c.p), dxr, store_tol(d), "max_pool2d backward", &b);
    check_close(fused::max_pool2d_backward_composite(dy, i, xs), dxr, store_tol(d), "max_pool2d backward (composite)", &b);
  }
}

TEMPLATE_TEST_CASE("avg_pool2d against Reference: forward and backward", "[pool]", KILN_TEST_BACKENDS) {
  Gen g(22);
  for (int it = 0; it < 60; ++it) {
    const PoolCase c = random_pool(g, false);
    const DType d = it % 4 == 3 ? DType::f64 : it % 4 == 2 ? DType::f16 : DType::f32;
    INFO(c.str() << " " << dtype_name(d) << " layout " << it % 3);
    RT xr, dyr;
    Tensor<TestType> x, dy;
    make4<TestType>(g, {c.N, c.C, c.H, c.W}, d, it % 3, xr, x);
    const RT yr = fused::avg_pool2d(xr, c.p);
    const int64_t n = c.p.kernel.h * c.p.kernel.w + 1;  // the window sum and the division
    const auto fb = sum_bound(host(fused::avg_pool2d(absf64(xr), c.p)), n, d);
    check_close(fused::avg_pool2d(x, c.p), yr, store_tol(d), "avg_pool2d forward", &fb);
    check_close(fused::avg_pool2d_composite(x, c.p), yr, store_tol(d), "avg_pool2d forward (composite)", &fb);
    make4<TestType>(g, yr.shape(), d, 1, dyr, dy);
    const Shape xs = xr.shape();
    const RT dxr = fused::avg_pool2d_backward(dyr, xs, c.p);
    const auto bb = sum_bound(host(fused::avg_pool2d_backward(absf64(dyr), xs, c.p)), n, d);
    check_close(fused::avg_pool2d_backward(dy, xs, c.p), dxr, store_tol(d), "avg_pool2d backward", &bb);
    check_close(fused::avg_pool2d_backward_composite(dy, xs, c.p), dxr, store_tol(d), "avg_pool2d backward (composite)", &bb);
  }
}

TEMPLATE_TEST_CASE("adaptive_avg_pool2d against Reference through autograd", "[pool]", KILN_TEST_BACKENDS) {
  Gen g(23);
  for (int it = 0; it < 30; ++it) {
    const int64_t N = g.integer(1, 2), C = g.integer(1, 3), H = g.integer(1, 11), W = g.integer(1, 11);
    const Size2 out{g.integer(1, H + 2), g.integer(1, W + 2)};  // larger than the input too (windows overlap)
    const DType d = it % 3 == 2 ? DType::f64 : DType::f32;
    INFO(fmt::format("x [{}, {}, {}, {}] -> ({}, {}) {}", N, C, H, W, out.h, out.w, dtype_name(d)));
    RT xr, dyr;
    Tensor<TestType> x, dy;
    make4<TestType>(g, {N, C, H, W}, d, it % 3, xr, x);
    Var<Ref> vr(xr, true);
    Var<TestType> v(x, true);
    const Var<Ref> yr = autograd::PoolOps<Ref>::adaptive_avg_pool2d(vr, out);
    const Var<TestType> y = autograd::PoolOps<TestType>::adaptive_avg_pool2d(v, out);
    REQUIRE(yr.shape() == Shape{N, C, out.h, out.w});
    make4<TestType>(g, yr.shape(), d, 0, dyr, dy);
    yr.backward(dyr);
    y.backward(dy);
    const int64_t n = (H / out.h + 2) * (W / out.w + 2) + 2;
    const auto fb = sum_bound(host(fused::adaptive_avg_pool2d(absf64(xr), out)), n, d);
    check_close(y.value(), yr.value(), store_tol(d), "adaptive_avg_pool2d forward", &fb);
    const auto bb = sum_bound(host(fused::adaptive_avg_pool2d_backward(absf64(dyr), xr.shape())), n, d);
    check_close(v.grad(), vr.grad(), store_tol(d), "adaptive_avg_pool2d backward", &bb);
  }
}

TEMPLATE_TEST_CASE("max_pool2d node saves the indices, not the input", "[pool]", KILN_BACKEND_TYPES) {
  Var<TestType> x(Tensor<TestType>::randn({2, 3, 6, 5}), true);
  const Var<TestType> y = autograd::PoolOps<TestType>::max_pool2d(x, Pool2dParams{.kernel = 2, .stride = 2});
  const auto* fn = y.node()->backward.template target<autograd::MaxPool2dBackward<TestType>>();
  REQUIRE(fn != nullptr);
  const auto saved = fn->saved();
  REQUIRE(saved.size() == 1);
  CHECK(saved[0].dtype() == DType::i64);
  CHECK(saved[0].shape() == Shape{2, 3, 3, 2});
  CHECK(saved[0].storage() != x.value().storage());
}

TEMPLATE_TEST_CASE("pooling: unbatched [C, H, W] input", "[pool]", KILN_BACKEND_TYPES) {
  const Tensor<TestType> x = Tensor<TestType>::randn({3, 7, 5}, DType::f64);
  const Pool2dParams p{.kernel = 3, .stride = 2, .padding = 1};
  Var<TestType> v(x, true);
  const Var<TestType> y = autograd::PoolOps<TestType>::max_pool2d(v, p);
  REQUIRE(y.shape() == Shape{3, 4, 3});
  check_close(y.value(), fused::max_pool2d(x.unsqueeze(0), p).first.squeeze(0), Tol{}, "unbatched max");
  y.sum().backward();
  CHECK(v.grad().shape() == x.shape());
  CHECK(autograd::PoolOps<TestType>::avg_pool2d(v, p).shape() == Shape{3, 4, 3});
  CHECK(autograd::PoolOps<TestType>::adaptive_avg_pool2d(v, Size2{2, 3}).shape() == Shape{3, 2, 3});
}
