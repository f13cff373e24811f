// Convolution conformance: every backend's fused conv2d / conv_transpose2d (forward, backward-input,
// backward-weight) and the composite default (im2col + matmul, what Cuda runs) against Reference's
// loops, on random geometries (odd sizes, strides, padding, dilation, groups, depthwise) and
// non-contiguous inputs (permuted from NHWC, stepped slices).
//
// Tolerance: each output element is a sum of n products; any summation order is within
// (n + 2) u Σ|terms| of the exact value (Higham), with Σ|terms| computed by Reference from |x|, |w|
// (the same op on absolute values), u the unit roundoff of the compute type (f32 for f32 and the half
// types, f64 for f64), plus 2 u_store |want| for the final rounding to the storage type.
#include <catch2/catch.hpp>

#include "conv_common.hpp"

#include <kiln/autograd/ops.hpp>

using namespace kiln;
using namespace kt;

// The overrides these tests compare are the ones that run: Reference's loops and Cpu's oneDNN/loops.
static_assert(fused::HasConv2d<Reference> && fused::HasMaxPool2d<Reference> && fused::HasAvgPool2d<Reference>);
static_assert(fused::HasConv2d<Cpu> && fused::HasMaxPool2d<Cpu> && fused::HasAvgPool2d<Cpu>);

namespace {

template <Backend B> Tensor<B> absf64(const Tensor<B>& t) { return t.to(DType::f64).abs(); }

template <Backend B> void conv_case(Gen& g, const ConvCase& c, DType d, int xl, int wl) {
  INFO(c.str() << " " << dtype_name(d) << " x layout " << xl << " w layout " << wl);
  RT xr, wr, br, dyr;
  Tensor<B> x, w, b, dy;
  make4<B>(g, {c.N, c.C, c.H, c.W}, d, xl, xr, x);
  make4<B>(g, {c.O, c.C / c.p.groups, c.kh, c.kw}, d, wl, wr, w);
  if (c.bias) {
    const std::vector<double> v = g.values(c.O, d, -1, 1);
    br = g.tensor_from<Ref>(v, {c.O}, d);
    b = g.tensor_from<B>(v, {c.O}, d);
  }
  const RT yr = fused::conv2d(xr, wr, br, c.p);
  const Shape ys = yr.shape();
  make4<B>(g, ys, d, xl, dyr, dy);
  const int64_t kk = c.kh * c.kw, Cg = c.C / c.p.groups, Og = c.O / c.p.groups;

  // forward: n = Cg·kh·kw products + the bias
  RT mag = fused::conv2d(absf64(xr), absf64(wr), RT(), c.p);
  if (c.bias) mag = mag.add(absf64(br).reshape({1, c.O, 1, 1}));
  const auto fb = sum_bound(host(mag), Cg * kk + 1, d);
  check_close(fused::conv2d(x, w, b, c.p), yr, store_tol(d), "conv2d forward", &fb);
  check_close(fused::conv2d_composite(x, w, b, c.p), yr, store_tol(d), "conv2d forward (composite)", &fb);

  // backward input: n = O/groups·kh·kw
  const Shape xs{c.N, c.C, c.H, c.W};
  const RT dxr = fused::conv2d_backward_input(dyr, wr, xs, c.p);
  const auto ib = sum_bound(host(fused::conv2d_backward_input(absf64(dyr), absf64(wr), xs, c.p)), Og * kk, d);
  check_close(fused::conv2d_backward_input(dy, w, xs, c.p), dxr, store_tol(d), "conv2d backward input", &ib);
  check_close(fused::conv2d_backward_input_composite(dy, w, xs, c.p), dxr, store_tol(d), "conv2d backward input (composite)", &ib);

  // backward weight: n = N·Ho·Wo; bias: the same count
  const Shape ws = wr.shape();
  const auto [dwr, dbr] = fused::conv2d_backward_weight(dyr, xr, ws, c.p, c.bias);
  const auto wb = sum_bound(host(fused::conv2d_backward_weight(absf64(dyr), absf64(xr), ws, c.p, false).first), c.N * ys[2] * ys[3], d);
  const auto [dw, db] = fused::conv2d_backward_weight(dy, x, ws, c.p, c.bias);
  check_close(dw, dwr, store_tol(d), "conv2d backward weight", &wb);
  const auto [dwc, dbc] = fused::conv2d_backward_weight_composite(dy, x, ws, c.p, c.bias);
  check_close(dwc, dwr, store_tol(d), "conv2d backward weight (composite)", &wb);
  if (c.bias) {
    const auto bb = sum_bound(host(absf64(dyr).sum({0, 2, 3})), c.N * ys[2] * ys[3], d);
    check_close(db, dbr, store_tol(d), "conv2d backward bias", &bb);
    check_close(dbc, dbr, store_tol(d), "conv2d backward bias (composite)", &bb);
  } else {
    CHECK_FALSE(db.defined());
  }
}

}  // namespace

TEMPLATE_TEST_CASE("conv2d against Reference: random geometries, forward and backward", "[conv]", KILN_TEST_BACKENDS) {
  Gen g(7);
  for (int it = 0; it < 60; ++it) {
    const ConvCase c = random_conv(g);
    const DType d = it % 3 == 2 ? DType::f64 : DType::f32;
    conv_case<TestType>(g, c, d, it % 3, (it / 3) % 2);
  }
}

TEMPLATE_TEST_CASE("conv2d against Reference: bf16 and f16 compute in f32", "[conv]", KILN_TEST_BACKENDS) {
  Gen g(8);
  for (int it = 0; it < 8; ++it) conv_case<TestType>(g, random_conv(g), it % 2 ? DType::bf16 : DType::f16, it % 3, 0);
}

TEMPLATE_TEST_CASE("conv2d: shapes a CNN uses (3x3 pad 1, strided 1x1, depthwise, 7x7 stride 2)", "[conv]", KILN_TEST_BACKENDS) {
  Gen g(9);
  const std::vector<ConvCase> cases = {
      {2, 16, 28, 28, 32, 3, 3, {1, 1, 1, 1}, true},  {2, 32, 14, 14, 64, 1, 1, {2, 0, 1, 1}, false},
      {2, 32, 15, 15, 32, 3, 3, {1, 1, 1, 32}, true}, {1, 3, 33, 31, 16, 7, 7, {2, 3, 1, 1}, true},
      {3, 8, 9, 9, 12, 3, 3, {1, 2, 2, 4}, true},
  };
  for (const ConvCase& c : cases) conv_case<TestType>(g, c, DType::f32, 0, 0);
}

TEMPLATE_TEST_CASE("conv_transpose2d against Reference, through autograd", "[conv]", KILN_TEST_BACKENDS) {
  Gen g(11);
  for (int it = 0; it < 30; ++it) {
    const int64_t groups = g.integer(1, 3), cin = groups * g.integer(1, 3), og = g.integer(1, 3);
    const int64_t N = g.integer(1, 3), H = g.integer(1, 6), W = g.integer(1, 6), kh = g.integer(1, 4), kw = g.integer(1, 4);
    Conv2dParams p{{g.integer(1, 3), g.integer(1, 3)}, {0, 0}, {g.integer(1, 2), g.integer(1, 2)}, groups};
    // padding small enough that the output is non-empty
    p.padding = {g.integer(0, ((H - 1) * p.stride.h + p.dilation.h * (kh - 1)) / 2),
                 g.integer(0, ((W - 1) * p.stride.w + p.dilation.w * (kw - 1)) / 2)};
    const Size2 op{g.integer(0, std::max(p.stride.h, p.dilation.h) - 1), g.integer(0, std::max(p.stride.w, p.dilation.w) - 1)};
    const DType d = it % 3 == 2 ? DType::f64 : DType::f32;
    const bool bias = g.coin();
    INFO(fmt::format("x [{}, {}, {}, {}] w [{}, {}, {}, {}] stride ({}, {}) pad ({}, {}) dil ({}, {}) out_pad ({}, {}) groups {} {}", N,
                     cin, H, W, cin, og, kh, kw, p.stride.h, p.stride.w, p.padding.h, p.padding.w, p.dilation.h, p.dilation.w, op.h, op.w,
                     groups, dtype_name(d)));
    RT xr, wr, br;
    Tensor<TestType> x, w, b;
    make4<TestType>(g, {N, cin, H, W}, d, it % 3, xr, x);
    make4<TestType>(g, {cin, og, kh, kw}, d, 0, wr, w);
    if (bias) {
      const std::vector<double> v = g.values(og * groups, d, -1, 1);
      br = g.tensor_from<Ref>(v, {og * groups}, d);
      b = g.tensor_from<TestType>(v, {og * groups}, d);
    }
    Var<Ref> vxr(xr, true), vwr(wr, true), vbr = bias ? Var<Ref>(br, true) : Var<Ref>();
    Var<TestType> vx(x, true), vw(w, true), vb = bias ? Var<TestType>(b, true) : Var<TestType>();
    const Var<Ref> yr = autograd::ConvOps<Ref>::conv_transpose2d(vxr, vwr, vbr, p, op);
    const Var<TestType> y = autograd::ConvOps<TestType>::conv_transpose2d(vx, vw, vb, p, op);
    RT dyr;
    Tensor<TestType> dy;
    make4<TestType>(g, yr.shape(), d, 0, dyr, dy);
    yr.backward(dyr);
    y.backward(dy);
    // Σ|terms| of every output and gradient: the same computation on |x|, |w|, |b|, |dy| (all terms >= 0)
    Var<Ref> ax(absf64(xr), true), aw(absf64(wr), true), ab = bias ? Var<Ref>(absf64(br), true) : Var<Ref>();
    autograd::ConvOps<Ref>::conv_transpose2d(ax, aw, ab, p, op).backward(absf64(dyr));
    const RT ay = fused::conv_transpose2d(absf64(xr), absf64(wr), bias ? absf64(br) : RT(), p, op);
    // forward: at most cin/groups·kh·kw products (+ bias); dx: og·kh·kw; dw: N·H·W; db: N·Ho·Wo
    const Tol t = {2 * u_store(d), 0.0};
    const auto yb = sum_bound(host(ay), (cin / groups) * kh * kw + 1, d);
    check_close(y.value(), yr.value(), t, "conv_transpose2d forward", &yb);
    const auto xb = sum_bound(host(ax.grad()), og * kh * kw, d);
    check_close(vx.grad(), vxr.grad(), t, "conv_transpose2d dx", &xb);
    const auto wb = sum_bound(host(aw.grad()), N * H * W, d);
    check_close(vw.grad(), vwr.grad(), t, "conv_transpose2d dw", &wb);
    if (bias) {
      const auto bb = sum_bound(host(ab.grad()), N * yr.size(2) * yr.size(3), d);
      check_close(vb.grad(), vbr.grad(), t, "conv_transpose2d db", &bb);
    }
  }
}

TEMPLATE_TEST_CASE("conv2d through autograd: unbatched input, no bias, grads only where needed", "[conv]", KILN_TEST_BACKENDS) {
  Gen g(12);
  RT xr, wr;
  Tensor<TestType> x, w;
  make4<TestType>(g, {1, 4, 7, 6}, DType::f64, 0, xr, x);
  make4<TestType>(g, {6, 2, 3, 2}, DType::f64, 0, wr, w);
  const Conv2dParams p{{2, 1}, {1, 0}, {1, 2}, 2};
  Var<TestType> vx(x.squeeze(0), true), vw(w, false);
  const Var<TestType> y = autograd::ConvOps<TestType>::conv2d(vx, vw, Var<TestType>(), p);
  const RT yr = fused::conv2d(xr, wr, RT(), p);
  REQUIRE(y.shape() == Shape{6, 4, 4});
  check_close(y.value(), yr.squeeze(0), Tol{1e-12, 1e-12}, "unbatched forward");
  y.sum().backward();
  REQUIRE(vx.grad().shape() == Shape{4, 7, 6});
  CHECK_FALSE(vw.grad().defined());
  const RT dxr = fused::conv2d_backward_input(RT::ones(yr.shape(), DType::f64), wr, xr.shape(), p);
  check_close(vx.grad(), dxr.squeeze(0), Tol{1e-12, 1e-12}, "unbatched dx");
}
