// The Cpu backend's kernels against the Reference backend: every primitive, every dtype it accepts, on
// contiguous, transposed, sliced-with-step (offset, stride 2), expanded (stride 0), permuted, size-0 and
// size-1 inputs, and the special values (inf, nan, subnormals) the vector math must handle. Exact
// agreement where the arithmetic is exact (copy, fill, where, gather, scatter_add, rand, +-*/ max min,
// comparisons, integer ops), a tolerance tied to the dtype's precision elsewhere.
#include <catch2/catch.hpp>

#include <array>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <kiln/backends/cpu/cpu.hpp>
#include <kiln/backends/reference/reference.hpp>
#include <kiln/core/fused.hpp>

using namespace kiln;
using R = Tensor<Reference>;
using C = Tensor<Cpu>;

namespace {

const std::vector<DType> kAll{DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::boolean};
const std::vector<DType> kFloat{DType::f32, DType::f64, DType::bf16, DType::f16};

struct Pair {
  R r;
  C c;
};

C to_cpu(const R& r) { return r.to<Cpu>(); }

// Random values of dtype dt: normal floats, integers in [-20, 20], bools.
R random_ref(const Shape& s, DType dt, uint64_t seed) {
  Generator g(seed);
  const R x = R::randn(s, DType::f64, &g);
  if (is_floating(dt)) return x.to(dt);
  if (dt == DType::boolean) return x.gt(R::scalar(0.0, DType::f64));
  return x.mul(8.0).to(dt);
}

// The same logical values on both backends as view kind k of shape s:
//  0 contiguous, 1 transposed (last two dims), 2 sliced with step 2 and an offset, 3 expanded (stride 0
//  on one dim), 4 permuted (rank >= 3: dims reversed).
Pair make(const Shape& s, DType dt, int k, uint64_t seed = 1) {
  const size_t r = s.size();
  if (k == 1 && r >= 2) {
    Shape b = s;
    std::swap(b[r - 1], b[r - 2]);
    const R base = random_ref(b, dt, seed);
    return {base.transpose(-1, -2), to_cpu(base).transpose(-1, -2)};
  }
  if (k == 2 && r >= 1) {
    Shape b = s;
    b[0] = 2 * s[0] + 1;
    const R base = random_ref(b, dt, seed);
    return {base.slice(0, 1, 2 * s[0] + 1, 2), to_cpu(base).slice(0, 1, 2 * s[0] + 1, 2)};
  }
  if (k == 3 && r >= 1) {
    Shape b = s;
    const size_t d = r > 1 ? 1 : 0;
    b[d] = 1;
    const R base = random_ref(b, dt, seed);
    return {base.expand(s), to_cpu(base).expand(s)};
  }
  if (k == 4 && r >= 3) {
    Shape b(s.rbegin(), s.rend());
    std::vector<int64_t> perm;
    for (size_t i = r; i-- > 0;) perm.push_back(static_cast<int64_t>(i));
    const R base = random_ref(b, dt, seed);
    return {base.permute(perm), to_cpu(base).permute(perm)};
  }
  const R base = random_ref(s, dt, seed);
  return {base, to_cpu(base)};
}

template <class T> std::vector<uint8_t> bytes(const Tensor<T>& t) {
  const Tensor<T> c = t.contiguous();
  std::vector<uint8_t> v(static_cast<size_t>(c.numel()) * dtype_size(c.dtype()));
  if (!v.empty()) c.copy_to_host(v.data(), v.size());
  return v;
}

// Bit-identical contents (same shape and dtype).
void check_exact(const C& c, const R& r) {
  REQUIRE(c.shape() == r.shape());
  REQUIRE(c.dtype() == r.dtype());
  CHECK(bytes(c) == bytes(r));
}

struct Tol {
  double rtol, atol;
};
Tol tol_for(DType dt) {
  switch (dt) {
    case DType::f32:
      return {1e-5, 1e-6};
    case DType::f64:
      return {1e-12, 1e-12};
    case DType::bf16:
      return {1.0 / 128, 1e-6};  // one bf16 ulp (8-bit significand)
    case DType::f16:
      return {1.0 / 1024, 1e-6};  // one f16 ulp (11-bit significand)
    default:
      return {0, 0};
  }
}

// allclose with nan == nan and equal infinities.
void check_close(const C& c, const R& r, Tol t) {
  REQUIRE(c.shape() == r.shape());
  REQUIRE(c.dtype() == r.dtype());
  const auto a = to_vector<double>(c), b = to_vector<double>(r);
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = a[i], y = b[i];
    bool ok;
    if (std::isnan(y))
      ok = std::isnan(x);
    else if (std::isinf(y))
      ok = x == y;
    else
      ok = std::abs(x - y) <= t.atol + t.rtol * std::abs(y);
    if (!ok && bad++ < 5) UNSCOPED_INFO("element " << i << ": cpu " << x << " vs reference " << y);
  }
  CHECK(bad == 0);
}
void check_close(const C& c, const R& r) { check_close(c, r, tol_for(r.dtype())); }

const std::vector<Shape> kShapes{{}, {1}, {7}, {3, 5}, {4, 1, 6}, {2, 3, 4, 5}, {0, 3}, {257, 129}, {70000}};

// Large shapes (several threads, vector bodies and tails) are run on fewer views and dtypes: the
// Reference oracle is slow.
bool skip_big(const Shape& s, DType dt, int k) {
  return numel(s) > 10000 && (k > 1 || !(dt == DType::f32 || dt == DType::bf16 || dt == DType::i64));
}

}  // namespace

TEST_CASE("cpu kernels: copy converts every dtype pair like Reference, on every view", "[cpu]") {
  for (const Shape& s : kShapes)
    for (int k = 0; k < 5; ++k)
      for (DType from : kAll)
        for (DType to : kAll) {
          INFO("shape " << shape_str(s) << " view " << k << " " << dtype_name(from) << " -> " << dtype_name(to));
          const Pair p = make(s, from, k);
          check_exact(p.c.to(to).contiguous(), p.r.to(to).contiguous());
        }
}

TEST_CASE("cpu kernels: copy of special values (inf, nan, subnormal, rounding ties, large ints)", "[cpu]") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> v{0.f,   -0.f,        inf,           -inf,          nan,      1e-40f,   -3e-39f, 65504.f, 65520.f,
                             1e10f, 1.00390625f, 1.0009765625f, 3.3895314e38f, 5.96e-8f, 2.98e-8f, 1.5f,    -2.5f,   255.5f};
  const R r = R::from_vector(v);
  const C c = C::from_vector(v);
  for (DType to : kFloat) check_exact(c.to(to), r.to(to));
  check_exact(c.to(DType::boolean), r.to(DType::boolean));
  const std::vector<int64_t> big{(int64_t{1} << 53) + 1, -(int64_t{1} << 62) + 3, 16777217, -16777219, 0, 1};
  const R ri = R::from_vector(big);
  const C ci = C::from_vector(big);
  for (DType to : kFloat) check_exact(ci.to(to), ri.to(to));
  check_exact(ci.to(DType::boolean), ri.to(DType::boolean));
  // same-dtype copies are exact
  check_exact(ci.t().contiguous(), ri);
}

TEST_CASE("cpu kernels: fill and copy_ into strided views", "[cpu]") {
  for (DType dt : kAll) {
    INFO(dtype_name(dt));
    check_exact(C::full({3, 70001}, 2.5, dt), R::full({3, 70001}, 2.5, dt));
    R r = R::zeros({6, 8}, dt);
    C c = C::zeros({6, 8}, dt);
    r.slice(1, 1, 8, 3).fill_(-3);
    c.slice(1, 1, 8, 3).fill_(-3);
    check_exact(c, r);
    const Pair src = make({8, 3}, dt, 1);
    r.slice(0, 0, 6, 2).t().copy_(src.r);
    c.slice(0, 0, 6, 2).t().copy_(src.c);
    check_exact(c, r);
  }
}

namespace {
template <class Op> void check_unary(double lo_shift = 0) {
  for (DType dt : kAll) {
    const bool ok = dt != DType::boolean && (!Op::float_only || is_floating(dt));
    for (const Shape& s : kShapes)
      for (int k = 0; k < 5; ++k) {
        if (skip_big(s, dt, k)) continue;
        INFO(Op::name << " " << dtype_name(dt) << " shape " << shape_str(s) << " view " << k);
        Pair p = make(s, dt, k, 7);
        if (lo_shift != 0 && ok) {  // a positive domain: |x| + shift
          const R pos = p.r.abs().add(lo_shift);
          p = {pos, to_cpu(pos)};
        }
        R ro = R::empty(s, dt);
        C co = C::empty(s, dt);
        if (!ok) {
          if (co.numel()) CHECK_THROWS_AS(Cpu::unary<Op>(co.mview(), p.c.cview()), Error);
          continue;
        }
        if (!co.numel()) continue;
        Reference::unary<Op>(ro.mview(), p.r.cview());
        Cpu::unary<Op>(co.mview(), p.c.cview());
        if (is_floating(dt))
          check_close(co, ro);
        else
          check_exact(co, ro);
      }
  }
}
}  // namespace

TEST_CASE("cpu kernels: unary ops on every dtype and view", "[cpu]") {
  check_unary<op::Neg>();
  check_unary<op::Abs>();
  check_unary<op::Square>();
  check_unary<op::Sign>();
  check_unary<op::Exp>();
  check_unary<op::Log>(0.01);
  check_unary<op::Log1p>(0.0);
  check_unary<op::Expm1>();
  check_unary<op::Sqrt>(0.0);
  check_unary<op::Rsqrt>(0.01);
  check_unary<op::Recip>(0.01);
  check_unary<op::Sin>();
  check_unary<op::Cos>();
  check_unary<op::Tanh>();
  check_unary<op::Sigmoid>();
  check_unary<op::Relu>();
  check_unary<op::Silu>();
  check_unary<op::Gelu>();
  check_unary<op::GeluTanh>();
}

namespace {
template <class Op> void check_unary_values(const std::vector<float>& v, double atol = 1e-37) {
  INFO(Op::name);
  const R r = R::from_vector(v);
  const C c = C::from_vector(v);
  R ro = R::empty(r.shape());
  C co = C::empty(c.shape());
  Reference::unary<Op>(ro.mview(), r.cview());
  Cpu::unary<Op>(co.mview(), c.cview());
  check_close(co, ro, {1e-5, atol});
}
}  // namespace

TEST_CASE("cpu kernels: vector math over wide ranges and special values", "[cpu]") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> v{0.f,     -0.f,   inf,     -inf,    nan,     1e-40f, -1e-40f, 1e-30f, 88.7f, 88.8f,  -87.3f,  -100.f,
                       -103.5f, -110.f, 0.6249f, 0.6251f, -0.625f, 9.f,    -9.1f,   20.f,   1e-8f, -1e-8f, 3.4e38f, 1.17e-38f};
  for (int i = -20000; i <= 20000; ++i) v.push_back(static_cast<float>(i) * 0.005f);  // [-100, 100]
  check_unary_values<op::Exp>(v);
  check_unary_values<op::Tanh>(v);
  check_unary_values<op::Sigmoid>(v);
  check_unary_values<op::Silu>(v);
  // gelu far out on the negative side: Reference's 1 + tanh / 1 + erf cancels to 0 in double where the
  // fused forms give the (tiny) true value, so these two are compared at the usual f32 atol.
  check_unary_values<op::GeluTanh>(v, tol_for(DType::f32).atol);
  check_unary_values<op::Gelu>(v, tol_for(DType::f32).atol);
  check_unary_values<op::Log>(v);  // negatives: nan, 0: -inf
  std::vector<float> w;
  for (int i = -4000; i <= 4000; ++i) w.push_back(std::ldexp(1.3f, i / 30));  // 2^-133 .. 2^133 (incl. subnormals)
  check_unary_values<op::Log>(w);
  check_unary_values<op::Sqrt>(w);
  check_unary_values<op::Rsqrt>(w);
}

namespace {
// Broadcast pairs: (a shape, b shape), each operand built as view kind ka / kb.
const std::vector<std::pair<Shape, Shape>> kBroadcasts{{{}, {}},
                                                       {{7}, {7}},
                                                       {{3, 5}, {3, 5}},
                                                       {{3, 5}, {5}},
                                                       {{3, 5}, {3, 1}},
                                                       {{1}, {4, 3}},
                                                       {{4, 3}, {}},
                                                       {{3, 1, 5}, {1, 4, 1}},
                                                       {{2, 3, 4, 5}, {2, 3, 4, 5}},
                                                       {{0, 3}, {3}},
                                                       {{300, 257}, {257}},
                                                       {{300, 257}, {300, 1}},
                                                       {{70000}, {70000}},
                                                       {{70000}, {1}}};

template <class Op> void check_binary(bool exact) {
  for (DType dt : kAll) {
    const bool ok = !(Op::float_only && !is_floating(dt)) && !(!Op::compare && dt == DType::boolean);
    for (const auto& [sa, sb] : kBroadcasts)
      for (int k = 0; k < 5; ++k) {
        if (skip_big(sa, dt, k)) continue;
        INFO(Op::name << " " << dtype_name(dt) << " " << shape_str(sa) << " with " << shape_str(sb) << " view " << k);
        Pair a = make(sa, dt, k, 3), b = make(sb, dt, (k + 2) % 5, 4);
        if (std::is_same_v<Op, op::Pow> && ok) {
          const R pos = a.r.abs().add(0.5);
          a = {pos, to_cpu(pos)};
        }
        const Shape s = broadcast_shapes(sa, sb, "test");
        const DType odt = Op::compare ? DType::boolean : dt;
        R ro = R::empty(s, odt);
        C co = C::empty(s, odt);
        if (!co.numel()) continue;
        const R ar = a.r.expand(s), br = b.r.expand(s);
        const C ac = a.c.expand(s), bc = b.c.expand(s);
        if (!ok) {
          CHECK_THROWS_AS(Cpu::binary<Op>(co.mview(), ac.cview(), bc.cview()), Error);
          continue;
        }
        Reference::binary<Op>(ro.mview(), ar.cview(), br.cview());
        Cpu::binary<Op>(co.mview(), ac.cview(), bc.cview());
        if (exact || !is_floating(odt))
          check_exact(co, ro);
        else
          check_close(co, ro);
      }
  }
}
}  // namespace

TEST_CASE("cpu kernels: binary ops with broadcasting on every dtype and view", "[cpu]") {
  // + - * / max min are correctly rounded in the compute type, so they agree bit for bit.
  check_binary<op::Add>(true);
  check_binary<op::Sub>(true);
  check_binary<op::Mul>(true);
  check_binary<op::Div>(true);
  check_binary<op::Maximum>(true);
  check_binary<op::Minimum>(true);
  check_binary<op::Pow>(false);
  check_binary<op::Eq>(true);
  check_binary<op::Ne>(true);
  check_binary<op::Lt>(true);
  check_binary<op::Le>(true);
  check_binary<op::Gt>(true);
  check_binary<op::Ge>(true);
  check_binary<op::LogicalAnd>(true);
  check_binary<op::LogicalOr>(true);
}

TEST_CASE("cpu kernels: in-place binary ops (output aliases an input)", "[cpu]") {
  for (DType dt : {DType::f32, DType::f64, DType::i32, DType::bf16}) {
    INFO(dtype_name(dt));
    Pair a = make({300, 257}, dt, 0, 5);
    const Pair b = make({257}, dt, 0, 6);
    R r = a.r.clone();
    C c = a.c.clone();
    r.add_(b.r);
    c.add_(b.c);
    check_exact(c, r);
    r.t().mul_(r.t());
    c.t().mul_(c.t());
    check_exact(c, r);
  }
}

TEST_CASE("cpu kernels: maximum/minimum propagate nan", "[cpu]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> x{nan, 1.f, nan, -0.f, 2.f}, y{1.f, nan, nan, 0.f, 1.f};
  check_exact(C::from_vector(x).maximum(C::from_vector(y)), R::from_vector(x).maximum(R::from_vector(y)));
  check_exact(C::from_vector(x).minimum(C::from_vector(y)), R::from_vector(x).minimum(R::from_vector(y)));
}

TEST_CASE("cpu kernels: where with broadcasting on every dtype", "[cpu]") {
  for (DType dt : kAll)
    for (int k = 0; k < 5; ++k) {
      INFO(dtype_name(dt) << " view " << k);
      const Pair cond = make({4, 1, 6}, DType::boolean, k, 11);
      const Pair a = make({4, 5, 6}, dt, (k + 1) % 5, 12), b = make({6}, dt, 0, 13);
      check_exact(C::where(cond.c, a.c, b.c), R::where(cond.r, a.r, b.r));
    }
}

namespace {
template <class Op> void check_reduce(const Pair& p, int axis) {
  Shape s = p.r.shape();
  s[static_cast<size_t>(axis)] = 1;
  const DType odt = Op::index ? DType::i64 : p.r.dtype();
  R ro = R::empty(s, odt);
  C co = C::empty(s, odt);
  if (!co.numel()) return;
  Reference::reduce<Op>(ro.mview(), p.r.cview(), axis);
  Cpu::reduce<Op>(co.mview(), p.c.cview(), axis);
  const bool exact = Op::index || std::is_same_v<Op, op::Max> || std::is_same_v<Op, op::Min> || !is_floating(odt);
  if (exact) return check_exact(co, ro);
  // Both accumulate in double, in different orders: allow n double roundings on top of the output's.
  Tol t = tol_for(odt);
  t.rtol += 2.3e-16 * static_cast<double>(p.r.shape()[static_cast<size_t>(axis)]);
  check_close(co, ro, t);
}
}  // namespace

TEST_CASE("cpu kernels: reductions along every axis, dtype and view", "[cpu]") {
  const std::vector<Shape> shapes{{7}, {3, 5}, {4, 1, 6}, {2, 3, 4, 5}, {300, 70}, {70, 300}, {5, 300, 7}, {1, 150000}, {150000}};
  for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64})
    for (const Shape& s : shapes)
      for (int k = 0; k < 5; ++k)
        for (int axis = 0; axis < static_cast<int>(s.size()); ++axis) {
          INFO(dtype_name(dt) << " shape " << shape_str(s) << " view " << k << " axis " << axis);
          Pair p = make(s, dt, k, 21);
          check_reduce<op::Sum>(p, axis);
          check_reduce<op::Max>(p, axis);
          check_reduce<op::Min>(p, axis);
          check_reduce<op::ArgMax>(p, axis);
          check_reduce<op::ArgMin>(p, axis);
          if (is_floating(dt)) {  // a product that neither overflows nor underflows
            const R q = p.r.mul(0.02).add(1.0);
            check_reduce<op::Prod>({q, to_cpu(q)}, axis);
          }
        }
  CHECK_THROWS_AS(Cpu::reduce<op::Sum>(C::empty({1}, DType::boolean).mview(), C::empty({3}, DType::boolean).cview(), 0), Error);
}

TEST_CASE("cpu kernels: reductions with nan, ties and infinities", "[cpu]") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (int64_t n : {5, 40, 200000}) {
    INFO("row length " << n);
    std::vector<float> v(static_cast<size_t>(n), 1.0f);
    v[static_cast<size_t>(n / 2)] = 3.0f;
    v[static_cast<size_t>(n - 2)] = 3.0f;  // tie: the first wins
    v[1] = -inf;
    std::vector<float> w = v;
    w[static_cast<size_t>(n * 3 / 4)] = nan;
    w[static_cast<size_t>(n - 1)] = nan;
    for (const auto& data : {v, w}) {
      const R r = R::from_vector(data);
      const Pair p{r, to_cpu(r)};
      check_reduce<op::Max>(p, 0);
      check_reduce<op::Min>(p, 0);
      check_reduce<op::ArgMax>(p, 0);
      check_reduce<op::ArgMin>(p, 0);
      check_reduce<op::Sum>(p, 0);
      const R r2 = r.reshape({1, n}).expand({3, n});
      check_reduce<op::ArgMax>({r2.t(), to_cpu(r2).t()}, 0);
      check_reduce<op::Max>({r2.t(), to_cpu(r2).t()}, 0);
    }
  }
}

namespace {
void check_matmul(const Pair& a, const Pair& b) {
  INFO(shape_str(a.r.shape()) << " @ " << shape_str(b.r.shape()) << " " << dtype_name(a.r.dtype()));
  const R ro = a.r.matmul(b.r);
  const C co = a.c.matmul(b.c);
  const double K = static_cast<double>(a.r.shape().back());
  Tol t = tol_for(a.r.dtype());
  if (a.r.dtype() == DType::f32) t.atol = 1e-6 * K;  // float accumulation over K products of O(1) values
  check_close(co, ro, t);
}
}  // namespace

TEST_CASE("cpu kernels: matmul layouts, batches and dtypes", "[cpu]") {
  for (DType dt : kFloat) {
    // plain, transposed operands (Trans flags), sliced rows (ld > cols), strided in both dims (copy)
    for (auto [M, K, N] :
         std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {3, 4, 5}, {1, 7, 9}, {9, 7, 1}, {33, 65, 17}, {64, 64, 64}, {130, 70, 90}}) {
      for (int ka : {0, 1, 2})
        for (int kb : {0, 1, 2}) check_matmul(make({M, K}, dt, ka, 31), make({K, N}, dt, kb, 32));
      // a slice of the last dim with step 2: neither dim has unit stride
      const R wide = random_ref({M, 2 * K}, dt, 33);
      check_matmul({wide.slice(1, 0, 2 * K, 2), to_cpu(wide).slice(1, 0, 2 * K, 2)}, make({K, N}, dt, 0, 34));
      // rows expanded from one (stride 0 inside the matrix)
      check_matmul(make({M, K}, dt, 3, 35), make({K, N}, dt, 0, 36));
    }
    // batched: equal batches, broadcast right operand (folds into M), broadcast left, permuted heads
    check_matmul(make({4, 9, 6}, dt, 0, 41), make({4, 6, 5}, dt, 1, 42));
    check_matmul(make({3, 40, 64}, dt, 0, 43), make({64, 48}, dt, 0, 44));
    check_matmul(make({3, 40, 64}, dt, 0, 43), make({64, 48}, dt, 1, 44));
    check_matmul(make({40, 64}, dt, 0, 45), make({3, 64, 48}, dt, 0, 46));
    check_matmul(make({2, 1, 8, 6}, dt, 0, 47), make({1, 3, 6, 7}, dt, 0, 48));
    check_matmul(make({2, 3, 5, 4}, dt, 4, 49), make({2, 3, 4, 6}, dt, 4, 50));
    const R q = random_ref({2, 33, 4, 16}, dt, 51), kk = random_ref({2, 33, 4, 16}, dt, 52);  // [B, T, H, D]
    check_matmul({q.permute({0, 2, 1, 3}), to_cpu(q).permute({0, 2, 1, 3})}, {kk.permute({0, 2, 3, 1}), to_cpu(kk).permute({0, 2, 3, 1})});
    // vectors
    check_matmul(make({7}, dt, 0, 53), make({7, 5}, dt, 0, 54));
    check_matmul(make({3, 7}, dt, 0, 55), make({7}, dt, 0, 56));
    check_matmul(make({7}, dt, 0, 57), make({7}, dt, 0, 58));
    // empty
    check_matmul(make({0, 4}, dt, 0, 59), make({4, 3}, dt, 0, 60));
    check_matmul(make({3, 0}, dt, 0, 61), make({0, 3}, dt, 0, 62));
  }
  // a strided (non-contiguous) output
  const Pair a = make({20, 30}, DType::f32, 0, 63), b = make({30, 10}, DType::f32, 0, 64);
  R ro = R::empty({10, 20});
  C co = C::empty({10, 20});
  Reference::matmul(ro.t().mview(), a.r.cview(), b.r.cview());
  Cpu::matmul(co.t().mview(), a.c.cview(), b.c.cview());
  check_close(co, ro, {1e-5, 3e-5});
  CHECK_THROWS_AS(
      Cpu::matmul(C::empty({2, 2}, DType::i32).mview(), C::empty({2, 2}, DType::i32).cview(), C::empty({2, 2}, DType::i32).cview()), Error);
}

TEST_CASE("cpu kernels: larger matmuls through both libraries", "[cpu]") {
  check_matmul(make({256, 192}, DType::f32, 0, 71), make({192, 320}, DType::f32, 1, 72));
  check_matmul(make({16, 128, 64}, DType::f32, 0, 73), make({16, 64, 128}, DType::f32, 0, 74));
  check_matmul(make({2, 100, 256}, DType::f32, 0, 75), make({256, 300}, DType::f32, 1, 76));
  check_matmul(make({200, 130}, DType::f64, 1, 77), make({130, 150}, DType::f64, 0, 78));
}

TEST_CASE("cpu kernels: set_matmul_library sends every layout through the library it names", "[cpu]") {
  struct Restore {  // the setting is process-wide: back to the default whatever happens
    ~Restore() { set_matmul_library("auto"); }
  } restore;
  CHECK(matmul_library() == "auto");
  for (const char* lib : {"blas", "onednn", "auto"}) {
    set_matmul_library(lib);
    CHECK(matmul_library() == lib);
    INFO("library " << lib);
    for (auto [M, K, N] : std::vector<std::array<int64_t, 3>>{{3, 4, 5}, {33, 65, 17}, {130, 70, 90}, {256, 192, 320}})
      for (int ka : {0, 1, 2})
        for (int kb : {0, 1, 2}) check_matmul(make({M, K}, DType::f32, ka, 91), make({K, N}, DType::f32, kb, 92));
    check_matmul(make({16, 128, 64}, DType::f32, 0, 93), make({16, 64, 128}, DType::f32, 1, 94));  // batched
    check_matmul(make({2, 1, 8, 6}, DType::f32, 0, 95), make({1, 3, 6, 7}, DType::f32, 0, 96));    // broadcast batches
    check_matmul(make({40, 64}, DType::bf16, 0, 97), make({64, 48}, DType::bf16, 1, 98));          // bf16: native or via f32
  }
  for (const char* bad : {"mkl", "", "BLAS", "tune"}) {
    INFO("name '" << bad << "'");
    CHECK_THROWS_WITH(set_matmul_library(bad),
                      Catch::Contains("set_matmul_library: unknown matmul library '" + std::string(bad) + "' (valid: auto, blas, onednn)"));
  }
  CHECK(matmul_library() == "auto");  // a refused name changes nothing
}

TEST_CASE("cpu kernels: OpenBLAS kernels older than the CPU are named, and auto then sends big f32 products to oneDNN",
          "[cpu][blas-core]") {
  using cpu::blas_core_predates;
  for (const char* old : {"Prescott", "prescott", "CORE2", "Nehalem", "Sandybridge", "Atom", "Bulldozer", "Steamroller", "Unknown"}) {
    INFO(old);
    CHECK(blas_core_predates(old, true));
    CHECK_FALSE(blas_core_predates(old, false));  // a CPU without AVX2 + FMA: nothing faster to miss
  }
  for (const char* current : {"Haswell", "HASWELL", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids", "Excavator", "FutureCore"}) {
    INFO(current);
    CHECK_FALSE(blas_core_predates(current, true));
  }
  CHECK_FALSE(blas_core().empty());
  // OPENBLAS_CORETYPE (ctest runs this case again with it set to Prescott) is what OpenBLAS reports
  if (const char* forced = std::getenv("OPENBLAS_CORETYPE")) {
    std::string want(forced), got(blas_core());
    for (auto* s : {&want, &got})
      for (char& ch : *s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    CHECK(got == want);
  }
  // A single f32 product of 1024^3: auto's rule gives it to OpenBLAS unless its kernels predate the CPU,
  // then to oneDNN. The two libraries sum in other orders, so the bits show which one ran.
  struct Restore {
    ~Restore() { set_matmul_library("auto"); }
  } restore;
  Generator g(41);
  const C a = C::randn({1024, 1024}, DType::f32, &g), b = C::randn({1024, 1024}, DType::f32, &g);
  const auto product = [&](const char* lib) {
    set_matmul_library(lib);
    return to_vector<float>(a.matmul(b));
  };
  const auto blas = product("blas"), onednn = product("onednn"), automatic = product("auto");
  INFO("OpenBLAS core " << blas_core() << ", predates this CPU: " << blas_core_predates_cpu());
  if (blas != onednn) {  // (compared as bools: Catch would print both million-element vectors)
    const bool auto_ran_onednn = automatic == onednn, auto_ran_blas = automatic == blas;
    CHECK(auto_ran_onednn == blas_core_predates_cpu());
    CHECK(auto_ran_blas == !blas_core_predates_cpu());
  }
}

TEST_CASE("cpu kernels: gather, index_select, scatter_add and index_add", "[cpu]") {
  std::mt19937 rng(5);
  for (DType dt : kAll)
    for (DType it : {DType::i64, DType::i32})
      for (int k = 0; k < 5; ++k) {
        INFO(dtype_name(dt) << " index " << dtype_name(it) << " view " << k);
        const Pair src = make({6, 7, 8}, dt, k, 81);
        for (int axis = 0; axis < 3; ++axis) {
          Shape is{5, 6, 4};  // smaller than src in the non-axis dims
          is[static_cast<size_t>(axis)] = 9;
          const int64_t lim = src.r.shape()[static_cast<size_t>(axis)];
          std::vector<int64_t> iv(static_cast<size_t>(numel(is)));
          for (auto& x : iv) x = static_cast<int64_t>(rng() % static_cast<uint32_t>(lim));
          const R ir = R::from_vector(iv, is).to(it);
          const C ic = C::from_vector(iv, is).to(it);
          check_exact(src.c.gather(axis, ic), src.r.gather(axis, ir));
          const R ir1 = ir.reshape({-1}).slice(0, 0, 11, 2);
          const C ic1 = ic.reshape({-1}).slice(0, 0, 11, 2);
          check_exact(src.c.index_select(axis, ic1), src.r.index_select(axis, ir1));
          if (dt == DType::boolean) continue;
          const Pair upd = make(is, dt, (k + 1) % 5, 82);
          check_exact(src.c.scatter_add(axis, ic, upd.c), src.r.scatter_add(axis, ir, upd.r));
          Shape us = src.r.shape();
          us[static_cast<size_t>(axis)] = ir1.numel();
          const Pair upd1 = make(us, dt, 0, 83);
          check_exact(src.c.index_add(axis, ic1, upd1.c), src.r.index_add(axis, ir1, upd1.r));
        }
      }
  // embedding-gradient shape: many duplicate rows, accumulated in the same order as Reference
  std::vector<int64_t> tok(4096);
  for (auto& x : tok) x = static_cast<int64_t>(rng() % 50);
  const Pair g = make({4096, 96}, DType::f32, 0, 84);
  check_exact(C::zeros({50, 96}).index_add(0, C::from_vector(tok), g.c), R::zeros({50, 96}).index_add(0, R::from_vector(tok), g.r));
  CHECK_THROWS_AS(
      Cpu::scatter_add(C::zeros({3}, DType::boolean).mview(), 0, C::zeros({3}, DType::i64).cview(), C::zeros({3}, DType::boolean).cview()),
      Error);
}

TEST_CASE("cpu kernels: random fills are bit-identical to Reference", "[cpu]") {
  for (DType dt : kAll)
    for (const Shape& s : {Shape{}, Shape{1}, Shape{3}, Shape{5, 7}, Shape{1001, 33}}) {
      INFO(dtype_name(dt) << " shape " << shape_str(s));
      R r = R::empty(s, dt);
      C c = C::empty(s, dt);
      Reference::rand_uniform(r.mview(), 99, 13, -2.0, 3.0);
      Cpu::rand_uniform(c.mview(), 99, 13, -2.0, 3.0);
      check_exact(c, r);
      Reference::rand_normal(r.mview(), 98, 5, 0.5, 2.0);
      Cpu::rand_normal(c.mview(), 98, 5, 0.5, 2.0);
      check_exact(c, r);
    }
  // through the generator, into strided views
  R r = R::zeros({40, 30});
  C c = C::zeros({40, 30});
  Generator gr(7), gc(7);
  r.t().slice(0, 1, 30, 2).normal_(0.0, 1.0, &gr);
  c.t().slice(0, 1, 30, 2).normal_(0.0, 1.0, &gc);
  check_exact(c, r);
  r.slice(0, 0, 40, 3).uniform_(0.0, 1.0, &gr);
  c.slice(0, 0, 40, 3).uniform_(0.0, 1.0, &gc);
  check_exact(c, r);
  check_exact(C::randn({77}, DType::bf16, &gc), R::randn({77}, DType::bf16, &gr));
}

TEST_CASE("cpu kernels: fused softmax and log_softmax, forward and backward", "[cpu]") {
  for (DType dt : kFloat)
    for (const Shape& s : {Shape{1, 1}, Shape{3, 7}, Shape{5, 8}, Shape{4, 16}, Shape{2, 3, 17}, Shape{64, 1000}, Shape{9, 4096}})
      for (bool log : {false, true}) {
        INFO(dtype_name(dt) << " shape " << shape_str(s) << (log ? " log_softmax" : " softmax"));
        const Pair x = make(s, dt, 0, 91), dy = make(s, dt, 1, 92);
        const R xr = x.r.mul(3.0);
        const C xc = x.c.mul(3.0);
        // The oracle: Reference's composite in f64 from the same inputs, rounded once to dt (in dt itself
        // the composite would round four intermediates to dt; the fused kernel rounds once).
        const auto oracle = [&](const R& t) { return t.to(DType::f64); };
        const R yr = fused::softmax(oracle(xr), -1, log).to(dt);
        const C yc = fused::softmax(xc, -1, log);
        check_close(yc, yr);
        const R y_in = yr;  // both backward passes from the same y
        check_close(fused::softmax_backward(to_cpu(y_in), dy.c, -1, log),
                    fused::softmax_backward(oracle(y_in), oracle(dy.r), -1, log).to(dt));
        // a non-last axis goes through a transposed copy
        check_close(fused::softmax(xc, 0, log), fused::softmax(oracle(xr), 0, log).to(dt));
      }
  // masked rows (-inf, as a causal mask makes them) and a row of one element
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> v{1.f, -inf, 2.f, -inf, -inf, -inf, 3.f, 0.5f, -inf, 7.f, 8.f, 9.f, 10.f, 11.f, 12.f, 13.f, 14.f, -inf};
  for (bool log : {false, true}) {
    const R r = R::from_vector(v, {2, 9});
    const C c = C::from_vector(v, {2, 9});
    check_close(fused::softmax(c, -1, log), fused::softmax(r, -1, log));
  }
}

TEST_CASE("cpu kernels: thread count is configurable and results do not depend on it", "[cpu]") {
  const int n0 = num_threads();
  CHECK(n0 >= 1);
  const Pair a = make({300, 257}, DType::f32, 1, 95), b = make({257, 200}, DType::f32, 0, 96);
  const C y0 = a.c.exp().add(a.c).sum({0});
  set_num_threads(1);
  CHECK(num_threads() == 1);
  const C y1 = a.c.exp().add(a.c).sum({0});
  const C m1 = a.c.matmul(b.c);
  set_num_threads(n0);
  CHECK(num_threads() == n0);
  CHECK(bytes(y0) == bytes(y1));
  check_close(m1, a.r.matmul(b.r), {1e-5, 3e-4});
}
