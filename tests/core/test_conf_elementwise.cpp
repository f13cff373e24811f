// Conformance: elementwise op families (every unary and binary op tag, scalar forms, where, clamp,
// casts, in-place ops) on every backend in KILN_TEST_BACKENDS against Reference, on random shapes and
// layouts. Seeded; each test case runs in well under a second.
#include "common/kiln_test.hpp"

using namespace kiln;
using namespace kt;

namespace {

template <class F> void for_each_unary(F&& f) {
#define X(OP) f.template operator()<op::OP>();
  KILN_UNARY_OPS(X)
#undef X
}
template <class F> void for_each_binary(F&& f) {
#define X(OP) f.template operator()<op::OP>();
  KILN_BINARY_OPS(X)
#undef X
}

// The input domain each unary op is tested on (away from poles, inside the real domain).
template <class Op> std::pair<double, double> unary_domain() {
  if constexpr (std::is_same_v<Op, op::Log> || std::is_same_v<Op, op::Sqrt> || std::is_same_v<Op, op::Rsqrt>)
    return {0.05, 5};
  else if constexpr (std::is_same_v<Op, op::Log1p>)
    return {-0.9, 5};
  else if constexpr (std::is_same_v<Op, op::Recip>)
    return {0.1, 4};
  else if constexpr (std::is_same_v<Op, op::Exp> || std::is_same_v<Op, op::Expm1>)
    return {-8, 8};
  else
    return {-5, 5};
}

}  // namespace

TEMPLATE_TEST_CASE("conformance: every unary op on random shapes and layouts", "[core][conformance]", KILN_TEST_BACKENDS) {
  using B = TestType;
  Gen g(101);
  for_each_unary([&]<class Op>() {
    std::vector<DType> dts = kFloatDTypes;
    if (!Op::float_only) dts.insert(dts.end(), {DType::i32, DType::i64});
    for (int it = 0; it < 24; ++it) {
      const DType d = g.pick(dts);
      const Lay l = g.pick(kLayouts);
      const Shape s = g.shape(0, 4, 7);
      auto [lo, hi] = unary_domain<Op>();
      RT rx;
      Tensor<B> bx;
      g.make_pair(s, d, l, rx, bx, lo, hi);
      check_close(bx.template map<Op>(), rx.template map<Op>(), elementwise_tol(d), fmt::format("{} on {}", Op::name, describe(s, d, l)));
    }
  });
}

TEMPLATE_TEST_CASE("conformance: unary ops at special values (0, -0, +-inf, nan, extremes)", "[core][conformance]", KILN_TEST_BACKENDS) {
  using B = TestType;
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  const std::vector<double> v{0.0, -0.0, inf, -inf, nan, 1e-30, -1e-30, 88.0, -88.0, 100.0, -100.0, 20.0, -20.0, 1e4, -1e4, 0.5};
  for (DType d : kFloatDTypes) {
    const RT r = RT::from_vector(v).to(d);
    const Tensor<B> b = r.template to<B>();
    for_each_unary([&]<class Op>() {
      // log/sqrt of negatives are nan on both; 1/0 is inf on both: all well-defined in IEEE
      check_close(b.template map<Op>(), r.template map<Op>(), elementwise_tol(d),
                  fmt::format("{} on specials, {}", Op::name, dtype_name(d)));
    });
  }
}

TEMPLATE_TEST_CASE("conformance: every binary op with broadcasting and strided operands", "[core][conformance]", KILN_TEST_BACKENDS) {
  using B = TestType;
  Gen g(202);
  for_each_binary([&]<class Op>() {
    std::vector<DType> dts = kFloatDTypes;
    if (!Op::float_only) dts.insert(dts.end(), {DType::i32, DType::i64});
    if (Op::compare) dts.push_back(DType::boolean);
    for (int it = 0; it < 24; ++it) {
      const DType d = g.pick(dts);
      auto [sa, sb] = broadcast_pair(g);
      const Lay la = g.pick(kLayouts), lb = g.pick(kLayouts);
      double lo = -4, hi = 4;
      if constexpr (std::is_same_v<Op, op::Pow>) lo = 0.1;
      RT ra, rb;
      Tensor<B> ba, bb;
      g.make_pair(sa, d, la, ra, ba, lo, hi);
      g.make_pair(sb, d, lb, rb, bb, std::is_same_v<Op, op::Div> ? 0.25 : lo, hi);
      if constexpr (Op::compare) {
        // small integers as floats: ties exercise eq/le/ge
        if (kiln::is_floating(d) && g.coin()) {
          ra = ra.to(DType::i32).to(d);
          rb = rb.to(DType::i32).to(d);
          ba = ba.to(DType::i32).to(d);
          bb = bb.to(DType::i32).to(d);
        }
      }
      const std::string what = fmt::format("{}: {} with {}", Op::name, describe(sa, d, la), describe(sb, d, lb));
      const Tol tol = Op::compare ? Tol{} : elementwise_tol(d);
      check_close(ba.template zip<Op>(bb), ra.template zip<Op>(rb), tol, what);
    }
  });
}

TEMPLATE_TEST_CASE("conformance: binary ops at special values", "[core][conformance]", KILN_TEST_BACKENDS) {
  using B = TestType;
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  const std::vector<double> v{0.0, -0.0, inf, -inf, nan, 1.0, -1.0, 2.5};
  const int64_t n = static_cast<int64_t>(v.size());
  for (DType d : kFloatDTypes) {
    // all pairs: a varies along axis 0, b along axis 1
    const RT ra = RT::from_vector(v, {n, 1}).to(d), rb = RT::from_vector(v, {1, n}).to(d);
    const Tensor<B> ba = ra.template to<B>(), bb = rb.template to<B>();
    for_each_binary([&]<class Op>() {
      check_close(ba.template zip<Op>(bb), ra.template zip<Op>(rb), Op::compare ? Tol{} : elementwise_tol(d),
                  fmt::format("{} on all pairs of specials, {}", Op::name, dtype_name(d)));
    });
  }
}

TEMPLATE_TEST_CASE("conformance: scalar forms, clamp and logical_not", "[core][conformance]", KILN_TEST_BACKENDS) {
  using B = TestType;
  Gen g(303);
  for (int it = 0; it < 40; ++it) {
    const DType d = g.pick(std::vector<DType>{DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64});
    const Lay l = g.pick(kLayouts);
    const Shape s = g.shape(0, 4, 6);
    RT r;
    Tensor<B> b;
    g.make_pair(s, d, l, r, b, 0.5, 4);
    const double sc = kiln::is_floating(d) ? g.real(-2, 2) : static_cast<double>(g.integer(-3, 3));
    const Scalar S = kiln::is_floating(d) ? Scalar(sc) : Scalar(static_cast<int64_t>(sc));
    const Tol t = elementwise_tol(d);
    const std::string w = fmt::format("{} scalar {}", describe(s, d, l), sc);
    check_close(b.add(S), r.add(S), t, "add " + w);
    check_close(b.sub(S), r.sub(S), t, "sub " + w);
    check_close(b.mul(S), r.mul(S), t, "mul " + w);
    check_close(b.maximum(S), r.maximum(S), t, "maximum " + w);
    check_close(b.minimum(S), r.minimum(S), t, "minimum " + w);
    check_close(b.clamp(-1, 2), r.clamp(-1, 2), t, "clamp " + w);
    check_close(b.eq(S), r.eq(S), Tol{}, "eq " + w);
    check_close(b.ne(S), r.ne(S), Tol{}, "ne " + w);
    check_close(b.lt(S), r.lt(S), Tol{}, "lt " + w);
    check_close(b.le(S), r.le(S), Tol{}, "le " + w);
    check_close(b.gt(S), r.gt(S), Tol{}, "gt " + w);
    check_close(b.ge(S), r.ge(S), Tol{}, "ge " + w);
    check_close(b.logical_not(), r.logical_not(), Tol{}, "logical_not " + w);
    if (kiln::is_floating(d)) {
      check_close(b.div(S), r.div(S), t, "div " + w);
      check_close(b.pow(S), r.pow(S), t, "pow " + w);
      check_close(-b, -r, t, "unary minus " + w);
      check_close(Scalar(1.5) - b, Scalar(1.5) - r, t, "scalar - tensor " + w);
      check_close(Scalar(1.5) / b, Scalar(1.5) / r, t, "scalar / tensor " + w);
      // the scalar form is the tensor form with a broadcast 0-dim operand (independent of Reference)
      check_close(b.mul(S), b.mul(Tensor<B>::full({}, S, d)), Tol{}, "mul(scalar) == mul(full({}))");
    }
  }
}

TEMPLATE_TEST_CASE("conformance: where with three broadcast operands", "[core][conformance]", KILN_TEST_BACKENDS) {
  using B = TestType;
  Gen g(404);
  for (int it = 0; it < 40; ++it) {
    auto [sa, sb] = broadcast_pair(g);
    const Shape sc = g.coin() ? sa : sb;
    const DType d = g.pick(kAllDTypes);
    RT rc, ra, rb;
    Tensor<B> bc, ba, bbt;
    g.make_pair(sc, DType::boolean, g.pick(kLayouts), rc, bc);
    g.make_pair(sa, d, g.pick(kLayouts), ra, ba);
    g.make_pair(sb, d, g.pick(kLayouts), rb, bbt);
    const auto got = Tensor<B>::where(bc, ba, bbt);
    const auto want = RT::where(rc, ra, rb);
    check_equal(got, want, fmt::format("where cond {} a {} b {} {}", shape_str(sc), shape_str(sa), shape_str(sb), dtype_name(d)));
    // independent: where(c, a, b) == c*a + (1-c)*b, exact in f64 for finite inputs (c is 0 or 1)
    if (d == DType::f64) {
      const RT cf = rc.to(DType::f64);
      check_equal(got, cf.mul(ra).add((Scalar(1.0) - cf).mul(rb)), "where == c*a + (1-c)*b");
    }
  }
}

TEMPLATE_TEST_CASE("conformance: cast among all dtypes, strided sources", "[core][conformance]", KILN_TEST_BACKENDS) {
  using B = TestType;
  Gen g(505);
  for (DType from : kAllDTypes)
    for (DType to : kAllDTypes)
      for (int it = 0; it < 4; ++it) {
        const Shape s = g.shape(0, 3, 6);
        const Lay l = g.pick(kLayouts);
        RT r;
        Tensor<B> b;
        // non-integral negative and positive values, so float->int truncation and bool conversion show
        g.make_pair(s, from, l, r, b, -300.7, 300.7);
        // the conversion is fully specified (round to nearest even via f32, truncate toward zero,
        // nonzero -> true): bit-exact
        check_bits(b.to(to), r.to(to), fmt::format("cast {} -> {} on {}", dtype_name(from), dtype_name(to), describe(s, from, l)));
      }
}

TEST_CASE("cast: literal values (bf16/f16 rounding, float->int truncation, bool)", "[core][cast]") {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  auto cast = [](const std::vector<double>& v, DType d) { return host(RT::from_vector(v).to(d)); };
  // bf16: 8 significand bits. 1 + 2^-8 is a tie -> even (1); 1 + 3*2^-8 is a tie -> even (1 + 2^-6);
  // 1 + 2^-8 + 2^-20 is above the tie -> 1 + 2^-7. Values as torch.tensor(v).bfloat16() gives them.
  CHECK(cast({1.0 + 0x1p-8, 1.0 + 3 * 0x1p-8, 1.0 + 0x1p-8 + 0x1p-20, 3.14159265, -65504.0, 1e-45, 1e-40, inf, -inf}, DType::bf16) ==
        std::vector<double>{1.0, 1.0 + 0x1p-6, 1.0 + 0x1p-7, 3.140625, -65536.0, 0.0, 9.183549615799121e-41, inf, -inf});
  CHECK(std::isnan(cast({nan}, DType::bf16)[0]));
  // f16: 65504 is the max; 65519.99 rounds down, 65520 overflows; 2^-24 is the smallest subnormal,
  // 2^-25 a tie to even (0), 3*2^-26 rounds up to 2^-24; 1 + 2^-11 a tie -> 1.
  CHECK(cast({65504.0, 65519.0, 65520.0, 0x1p-24, 0x1p-25, 3 * 0x1p-26, 1.0 + 0x1p-11, 1.0 + 3 * 0x1p-11, 0.1}, DType::f16) ==
        std::vector<double>{65504.0, 65504.0, inf, 0x1p-24, 0.0, 0x1p-24, 1.0, 1.0 + 0x1p-9, 0.0999755859375});
  // float -> int truncates toward zero (C and PyTorch)
  CHECK(cast({-1.7, -0.5, 0.5, 1.999, -2.0, 2.5, -100.9}, DType::i32) == std::vector<double>{-1, 0, 0, 1, -2, 2, -100});
  CHECK(cast({-1.7, -0.5, 0.5, 1.999, -2.0, 2.5, 3e9}, DType::i64) == std::vector<double>{-1, 0, 0, 1, -2, 2, 3e9});
  // anything nonzero (nan included) is true
  CHECK(cast({0.0, -0.0, 0.1, -3.0, nan, inf}, DType::boolean) == std::vector<double>{0, 0, 1, 1, 1, 1});
  CHECK(host(RT::from_vector(std::vector<int64_t>{0, 2, -1}).to(DType::boolean)) == std::vector<double>{0, 1, 1});
  const RT b = RT::from_vector(std::vector<uint8_t>{1, 0, 1});
  CHECK(b.dtype() == DType::boolean);
  for (DType d : kAllDTypes) CHECK(host(b.to(d)) == std::vector<double>{1, 0, 1});
  // bf16 -> f16 -> f32 round trips a value both represent exactly
  CHECK(host(RT::from_vector(std::vector<float>{0.375f, -12.5f}).to(DType::bf16).to(DType::f16).to(DType::f32)) ==
        std::vector<double>{0.375, -12.5});
}

TEMPLATE_TEST_CASE("conformance: in-place ops on strided targets", "[core][conformance]", KILN_TEST_BACKENDS) {
  using B = TestType;
  Gen g(606);
  for (int it = 0; it < 40; ++it) {
    const DType d = g.pick(std::vector<DType>{DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64});
    // the target must not be expanded; the operand may broadcast to the target's shape
    Lay lt = g.pick(kLayouts);
    if (lt == Lay::expanded) lt = Lay::stepped;
    const Shape s = g.shape(0, 4, 5);
    Shape so(s.begin() + g.integer(0, static_cast<int64_t>(s.size())), s.end());
    for (auto& x : so)
      if (g.coin(0.3)) x = 1;
    RT rt, ro;
    Tensor<B> bt, bo;
    g.make_pair(s, d, lt, rt, bt, 0.5, 3);
    g.make_pair(so, d, g.pick(kLayouts), ro, bo, 0.5, 3);
    const std::string w = fmt::format("target {} operand {}", describe(s, d, lt), shape_str(so));
    const Tol t = elementwise_tol(d);
    // each op applied to both; the base (not just the view) must match, so writes go where they should
    const int which = static_cast<int>(g.integer(0, 7));
    auto apply = [&](auto& x, const auto& o) {
      switch (which) {
        case 0:
          x.add_(o);
          break;
        case 1:
          x.sub_(o);
          break;
        case 2:
          x.mul_(o);
          break;
        case 3:
          if (kiln::is_floating(d))
            x.div_(o);
          else
            x.add_(o);
          break;
        case 4:
          x.add_(Scalar(2));
          break;
        case 5:
          x.mul_(Scalar(3));
          break;
        case 6:
          x.fill_(Scalar(7));
          break;
        default:
          x.copy_(o);
          break;
      }
    };
    apply(bt, bo);
    apply(rt, ro);
    check_close(bt, rt, t, fmt::format("in-place op #{} on {}", which, w));
  }
}

TEMPLATE_TEST_CASE("in-place ops write through views into the base tensor", "[core][inplace]", KILN_TEST_BACKENDS) {
  using B = TestType;
  // independent answers written by hand
  auto base = Tensor<B>::zeros({3, 4});
  base.slice(1, 1, 4, 2).fill_(5);  // columns 1 and 3
  CHECK(to_vector<float>(base) == std::vector<float>{0, 5, 0, 5, 0, 5, 0, 5, 0, 5, 0, 5});
  auto col = base.select(1, 0);
  col.copy_(tensor<B>({1.f, 2.f, 3.f}));
  CHECK(to_vector<float>(base) == std::vector<float>{1, 5, 0, 5, 2, 5, 0, 5, 3, 5, 0, 5});
  auto tr = base.t();
  tr.narrow(0, 2, 1).add_(tensor<B>({10.f, 20.f, 30.f}));  // column 2 of base, broadcast row
  CHECK(to_vector<float>(base) == std::vector<float>{1, 5, 10, 5, 2, 5, 20, 5, 3, 5, 30, 5});
  // copy_ broadcasts and converts dtype
  auto i = Tensor<B>::zeros({2, 3}, DType::i32);
  i.copy_(tensor<B>({1.9f, -2.7f, 3.2f}));
  CHECK(to_vector<int32_t>(i) == std::vector<int32_t>{1, -2, 3, 1, -2, 3});
  // an expanded tensor cannot be written
  auto e = Tensor<B>::zeros({1, 3}).expand({4, 3});
  CHECK_THROWS_AS(e.fill_(1), kiln::Error);
  CHECK_THROWS_AS(e.add_(Scalar(1)), kiln::Error);
  CHECK_THROWS_WITH(e.copy_(Tensor<B>::ones({4, 3})), Catch::Contains("copy_") && Catch::Contains("expanded") && Catch::Contains("[4, 3]"));
  // a broadcast operand that would grow the target is an error, not a silent partial write
  auto small = Tensor<B>::zeros({3});
  CHECK_THROWS_WITH(small.add_(Tensor<B>::ones({2, 3})), Catch::Contains("add") && Catch::Contains("[2, 3]"));
  // an expanded dim of size 1 (stride 0) is writable
  auto one = Tensor<B>::zeros({1, 3}).expand({1, 3});
  one.fill_(2);
  CHECK(to_vector<float>(one) == std::vector<float>{2, 2, 2});
}
