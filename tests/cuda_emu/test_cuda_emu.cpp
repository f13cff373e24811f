// The Cuda backend's kernels, run on the CPU by the host emulator (emu.hpp, bridge.hpp), against the
// Cpu backend on identical inputs. No GPU needed: the test names avoid the word that marks GPU tests
// (catch_main.cpp), and the tag is [cuda-emu].
//
// Bit-identical where the backends are designed to agree bit for bit (copy/cast, fill, where, gather,
// rand_uniform, rand_normal, integer ops, max/min/argmax/argmin); float elementwise ops within a few
// ulp (CUDA's libm here is the host's; the Cpu's is vectorised); float sums within Higham's bound.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "bridge.hpp"
#include "common/kiln_test.hpp"

namespace {

using kiln::Cpu;
using kiln::DType;
using kiln::Shape;
using CT = kiln::Tensor<Cpu>;
using kt::Lay;

cuda_emu::Buf buf(const CT& t) {
  cuda_emu::Buf b;
  b.data = const_cast<void*>(t.storage()->data());
  b.bytes = t.storage()->bytes();
  b.dtype = static_cast<int>(t.dtype());
  b.shape.assign(t.layout().shape.begin(), t.layout().shape.end());
  b.strides.assign(t.layout().strides.begin(), t.layout().strides.end());
  b.offset = t.layout().offset;
  return b;
}

// An output with garbage contents (so that a kernel that skips an element is caught).
CT garbage(const Shape& s, DType d) {
  CT t = CT::empty(s, d);
  if (t.storage() && t.storage()->bytes()) std::memset(t.storage()->data(), 0x5a, t.storage()->bytes());
  return t;
}

CT input(kt::Gen& g, const Shape& s, DType d, Lay l, double lo = -3, double hi = 3) {
  kt::RT ref;
  CT t;
  g.make_pair<Cpu>(s, d, l, ref, t, lo, hi);
  return t;
}

const std::vector<Lay> kLays{Lay::contiguous, Lay::transposed, Lay::stepped, Lay::narrowed, Lay::expanded, Lay::permuted};

}  // namespace

TEST_CASE("emu: copy and cast among all dtypes, strided sources and outputs", "[cuda-emu]") {
  kt::Gen g(11);
  for (DType from : kt::kAllDTypes)
    for (DType to : kt::kAllDTypes)
      for (Lay l : kLays) {
        const Shape s = g.shape(0, 4, 7, 0.02);
        const CT x = input(g, s, from, l);
        INFO(kt::describe(s, from, l) << " -> " << kiln::dtype_name(to));
        CT want = garbage(s, to), got = garbage(s, to);
        Cpu::copy(want.mview(), x.cview());
        cuda_emu::copy(buf(got), buf(x));
        kt::check_bits(got, want, "copy");
        if (s.size() >= 2) {  // a transposed output
          const int64_t r = static_cast<int64_t>(s.size());
          Shape b = s;
          std::swap(b[0], b.back());
          CT wb = garbage(b, to), gb = garbage(b, to);
          CT wt = wb.transpose(0, r - 1), gt = gb.transpose(0, r - 1);
          Cpu::copy(wt.mview(), x.cview());
          cuda_emu::copy(buf(gt), buf(x));
          kt::check_bits(gb, wb, "copy into a transposed output");
        }
      }
}

TEST_CASE("emu: fill every dtype, contiguous (memset) and strided", "[cuda-emu]") {
  kt::Gen g(12);
  for (DType d : kt::kAllDTypes)
    for (double v : {0.0, 1.5, -2.0, -0.0})
      for (bool strided : {false, true}) {
        INFO(kiln::dtype_name(d) << " value " << v << (strided ? " strided" : " contiguous"));
        const Shape s{5, 7};
        CT wb = garbage({5, 9}, d), gb = garbage({5, 9}, d);
        CT w = strided ? wb.narrow(1, 1, 7) : garbage(s, d), gt = strided ? gb.narrow(1, 1, 7) : garbage(s, d);
        Cpu::fill(w.mview(), kiln::Scalar(v));
        cuda_emu::fill(buf(gt), v, false, 0);
        kt::check_bits(strided ? gb.narrow(1, 1, 7) : gt, strided ? wb.narrow(1, 1, 7) : w, "fill");
      }
  // integral scalars
  for (DType d : {DType::i32, DType::i64}) {
    CT w = garbage({33}, d), gt = garbage({33}, d);
    Cpu::fill(w.mview(), kiln::Scalar(int64_t{-123456}));
    cuda_emu::fill(buf(gt), 0, true, -123456);
    kt::check_bits(gt, w, "fill integral");
  }
}

TEST_CASE("emu: every unary op on every dtype and layout", "[cuda-emu]") {
  kt::Gen g(13);
  const auto run = [&]<class Op>(kiln::type_tag<Op>) {
    for (DType d : kt::kAllDTypes) {
      if (d == DType::boolean || (Op::float_only && !kiln::is_floating(d))) continue;
      for (Lay l : kLays) {
        const Shape s = g.shape(1, 4, 9, 0.02);
        const CT x = input(g, s, d, l, -4, 4);
        INFO(Op::name << " " << kt::describe(s, d, l));
        CT want = garbage(s, d), got = garbage(s, d);
        Cpu::unary<Op>(want.mview(), x.cview());
        cuda_emu::unary(Op::name, buf(got), buf(x));
        kt::check_close(got, want, kt::elementwise_tol(d), Op::name);
      }
    }
  };
#define KILN_EMU_RUN(OP) run(kiln::type_tag<kiln::op::OP>{});
  KILN_UNARY_OPS(KILN_EMU_RUN)
#undef KILN_EMU_RUN
  // special values
  for (DType d : kt::kFloatDTypes) {
    const std::vector<double> v{0.0, -0.0, INFINITY, -INFINITY, NAN, 1e30, -1e30, 1e-30, 88.0, -88.0, 20.0, -20.0};
    const CT x = CT::from_vector(v, {static_cast<int64_t>(v.size())}).to(d);
    const auto sp = [&]<class Op>(kiln::type_tag<Op>) {
      INFO(Op::name << " special values " << kiln::dtype_name(d));
      CT want = garbage(x.shape(), d), got = garbage(x.shape(), d);
      Cpu::unary<Op>(want.mview(), x.cview());
      cuda_emu::unary(Op::name, buf(got), buf(x));
      kt::check_close(got, want, kt::elementwise_tol(d), Op::name);
    };
#define KILN_EMU_RUN(OP) sp(kiln::type_tag<kiln::op::OP>{});
    KILN_UNARY_OPS(KILN_EMU_RUN)
#undef KILN_EMU_RUN
  }
}

TEST_CASE("emu: every binary op with broadcast and strided operands", "[cuda-emu]") {
  kt::Gen g(14);
  const auto run = [&]<class Op>(kiln::type_tag<Op>) {
    for (DType d : kt::kAllDTypes) {
      if (Op::float_only && !kiln::is_floating(d)) continue;
      if (!Op::compare && d == DType::boolean) continue;
      for (int rep = 0; rep < 4; ++rep) {
        const Shape s = g.shape(1, 4, 7, 0.02);
        const Lay la = g.pick(kLays), lb = rep == 0 ? Lay::expanded : g.pick(kLays);
        const double lo = std::is_same_v<Op, kiln::op::Pow> ? 0.25 : -3;
        const CT a = input(g, s, d, la, lo, 3);
        const CT b = input(g, s, d, lb, std::is_same_v<Op, kiln::op::Div> ? 0.25 : -3, 3);
        const DType od = Op::compare ? DType::boolean : d;
        INFO(Op::name << " a " << kt::describe(s, d, la) << " b " << kt::layout_name(lb));
        CT want = garbage(s, od), got = garbage(s, od);
        Cpu::binary<Op>(want.mview(), a.cview(), b.cview());
        cuda_emu::binary(Op::name, buf(got), buf(a), buf(b));
        kt::check_close(got, want, kt::elementwise_tol(od), Op::name);
      }
    }
  };
#define KILN_EMU_RUN(OP) run(kiln::type_tag<kiln::op::OP>{});
  KILN_BINARY_OPS(KILN_EMU_RUN)
#undef KILN_EMU_RUN
}

TEST_CASE("emu: vectorised elementwise path, contiguous operands at every alignment and length", "[cuda-emu]") {
  // 1-D operands narrowed out of larger buffers at offsets 0..8: packs of 16 bytes apply only where
  // every operand is aligned, the rest takes the strided walk; lengths around multiples of the pack
  // size exercise the scalar tail. Results bit for bit equal to the Cpu's (the integer, copy and
  // select ops) or within the elementwise tolerance (float math).
  kt::Gen g(40);
  const uint64_t vec0 = cuda_emu::vec_launches();
  auto slice = [&](const CT& base, int64_t off, int64_t n) { return base.narrow(0, off, n); };
  for (DType d : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::boolean})
    for (int64_t n : {1, 2, 3, 7, 8, 9, 16, 17, 33}) {
      const int64_t oo = g.integer(0, 8), oa = g.integer(0, 8), ob = g.integer(0, 8);
      const bool same = g.coin(0.5);  // all operands at the same offset: the aligned case
      const int64_t o_out = same ? 0 : oo, o_a = same ? 0 : oa, o_b = same ? 0 : ob;
      const CT A = input(g, {n + 8}, d, Lay::contiguous), B = input(g, {n + 8}, d, Lay::contiguous);
      const CT a = slice(A, o_a, n), b = slice(B, o_b, n);
      INFO(kiln::dtype_name(d) << " n " << n << " offsets out " << o_out << " a " << o_a << " b " << o_b);
      {
        CT wb = garbage({n + 8}, d), gb = garbage({n + 8}, d);
        Cpu::copy(slice(wb, o_out, n).mview(), a.cview());
        cuda_emu::copy(buf(slice(gb, o_out, n)), buf(a));
        kt::check_bits(gb, wb, "copy");
        cuda_emu::fill(buf(slice(gb, o_out, n)), 1.0, false, 0);
        Cpu::fill(slice(wb, o_out, n).mview(), kiln::Scalar(1.0));
        kt::check_bits(gb, wb, "fill");
      }
      const DType to = d == DType::f32 ? DType::bf16 : DType::f32;
      {
        CT wb = garbage({n + 8}, to), gb = garbage({n + 8}, to);
        Cpu::copy(slice(wb, o_out, n).mview(), a.cview());
        cuda_emu::copy(buf(slice(gb, o_out, n)), buf(a));
        kt::check_bits(gb, wb, "cast");
      }
      if (d != DType::boolean) {
        CT wb = garbage({n + 8}, d), gb = garbage({n + 8}, d);
        Cpu::unary<kiln::op::Neg>(slice(wb, o_out, n).mview(), a.cview());
        cuda_emu::unary("neg", buf(slice(gb, o_out, n)), buf(a));
        kt::check_bits(gb, wb, "neg");
        Cpu::binary<kiln::op::Add>(slice(wb, o_out, n).mview(), a.cview(), b.cview());
        cuda_emu::binary("add", buf(slice(gb, o_out, n)), buf(a), buf(b));
        kt::check_close(gb, wb, kt::elementwise_tol(d), "add");
        CT wc = garbage({n + 8}, DType::boolean), gc = garbage({n + 8}, DType::boolean);
        Cpu::binary<kiln::op::Lt>(slice(wc, o_out, n).mview(), a.cview(), b.cview());
        cuda_emu::binary("lt", buf(slice(gc, o_out, n)), buf(a), buf(b));
        kt::check_bits(gc, wc, "lt");
        const CT c = slice(input(g, {n + 8}, DType::boolean, Lay::contiguous), o_a, n);
        Cpu::where(slice(wb, o_out, n).mview(), c.cview(), a.cview(), b.cview());
        cuda_emu::where(buf(slice(gb, o_out, n)), buf(c), buf(a), buf(b));
        kt::check_bits(gb, wb, "where");
      }
    }
  CHECK(cuda_emu::vec_launches() > vec0);  // the packed path ran
}

TEST_CASE("emu: where with broadcast operands, every dtype", "[cuda-emu]") {
  kt::Gen g(15);
  for (DType d : kt::kAllDTypes)
    for (int rep = 0; rep < 6; ++rep) {
      const Shape s = g.shape(1, 4, 7, 0.02);
      const CT c = input(g, s, DType::boolean, g.pick(kLays));
      const CT a = input(g, s, d, g.pick(kLays)), b = input(g, s, d, g.pick(kLays));
      INFO(kt::describe(s, d, Lay::contiguous));
      CT want = garbage(s, d), got = garbage(s, d);
      Cpu::where(want.mview(), c.cview(), a.cview(), b.cview());
      cuda_emu::where(buf(got), buf(c), buf(a), buf(b));
      kt::check_bits(got, want, "where");
    }
}

namespace {

// Reduces x along axis with the Cpu and the emulated kernels and compares: exact for integers,
// max/min and the index ops; float sum/prod within Higham's bound (n - 1) u_acc Σ|x| (prod: relative
// n u_acc) plus the storage rounding.
template <class Op> void check_reduce(const CT& x, int axis, const std::string& what) {
  const DType d = x.dtype();
  Shape os = x.shape();
  os[static_cast<size_t>(axis)] = 1;
  const DType od = Op::index ? DType::i64 : d;
  CT want = garbage(os, od), got = garbage(os, od);
  INFO(what << ": " << Op::name << " over axis " << axis << " of " << kiln::shape_str(x.shape()) << " " << kiln::dtype_name(d));
  Cpu::reduce<Op>(want.mview(), x.cview(), axis);
  cuda_emu::reduce(Op::name, buf(got), buf(x), axis);
  const bool exact = Op::index || !kiln::is_floating(d) || std::is_same_v<Op, kiln::op::Max> || std::is_same_v<Op, kiln::op::Min>;
  if (exact) return kt::check_bits(got, want, Op::name);
  const double n = static_cast<double>(x.shape()[static_cast<size_t>(axis)]);
  if (std::is_same_v<Op, kiln::op::Prod>) return kt::check_close(got, want, kt::Tol{n * kt::u_acc(d) + 2 * kt::u_store(d), 0}, Op::name);
  CT absx = garbage(x.shape(), d), bound = garbage(os, d);
  Cpu::unary<kiln::op::Abs>(absx.mview(), x.cview());
  Cpu::reduce<kiln::op::Sum>(bound.mview(), absx.cview(), axis);
  std::vector<double> bv = bound.to_vector<double>();
  for (double& b : bv) b *= std::max(1.0, n - 1) * kt::u_acc(d) * 1.01;
  kt::check_close(got, want, kt::Tol{2 * kt::u_store(d), 1e-300}, Op::name, &bv);
}

template <class F> void every_reduce_op(F&& f) {
  f(kiln::type_tag<kiln::op::Sum>{});
  f(kiln::type_tag<kiln::op::Prod>{});
  f(kiln::type_tag<kiln::op::Max>{});
  f(kiln::type_tag<kiln::op::Min>{});
  f(kiln::type_tag<kiln::op::ArgMax>{});
  f(kiln::type_tag<kiln::op::ArgMin>{});
}

}  // namespace

namespace {

// Every reduce op over shapes that take every kernel path of reduce.cu (multiProcessorCount is 4 in
// the emulator, so a long row splits into pieces).
void reduce_cases(kt::Gen& g, bool quick) {
  struct Case {
    Shape s;
    int axis;
    const char* path;
  };
  const std::vector<Case> cases{
      {{5, 7}, 1, "thread kernel (n <= 32)"},
      {{3, 4, 32}, 2, "thread kernel, n = 32"},
      {{9, 33}, 1, "block kernel, n = 33 (64 threads)"},
      {{6, 300}, 1, "block kernel, n = 300 (256 threads)"},
      {{300, 37}, 0, "cols kernel"},
      {{7, 45, 5}, 1, "cols kernel, middle axis"},
      {{1, 50000}, 1, "block kernel in pieces + second pass"},
      {{50000}, 0, "block kernel in pieces, rank 1"},
      {{3000, 3}, 0, "cols kernel in pieces + second pass"},
      {{2, 20001}, 1, "block kernel in pieces, 2 outputs"},
      {{4, 1}, 1, "n = 1"},
  };
  for (const Case& c : cases)
    for (DType d : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64}) {
      const bool big = kiln::numel(c.s) > 5000;
      if (quick && d != DType::f32 && d != DType::i64) continue;
      for (Lay l : {Lay::contiguous, Lay::transposed, Lay::stepped}) {
        if (big && l != Lay::contiguous && (quick || d != DType::f32)) continue;  // keep the run short
        g.ties = !kiln::is_floating(d) || l == Lay::stepped;                      // ties for argmax/argmin
        const CT x = input(g, c.s, d, l, -3, 3);
        g.ties = false;
        every_reduce_op([&]<class Op>(kiln::type_tag<Op>) {
          if (std::is_same_v<Op, kiln::op::Prod> && big) return;  // overflows either way
          check_reduce<Op>(x, c.axis, fmt::format("{} ({})", c.path, kt::layout_name(l)));
        });
      }
    }
}

}  // namespace

TEST_CASE("emu: reduce, every kernel path (thread, block, cols, pieces), every op and dtype", "[cuda-emu]") {
  kt::Gen g(16);
  reduce_cases(g, false);
}

TEST_CASE("emu: argmax/argmin ties and NaNs (first index wins, NaN is the extreme, first NaN wins)", "[cuda-emu]") {
  kt::Gen g(17);
  for (const Shape& s : {Shape{4, 20}, Shape{4, 100}, Shape{2, 9000}, Shape{300, 4}, Shape{1, 40000}})
    for (int axis : {0, 1})
      for (DType d : kt::kFloatDTypes)
        for (double p_nan : {0.0, 0.01, 0.3}) {
          if (kiln::numel(s) > 5000 && d != DType::f32) continue;
          g.ties = true;
          g.p_nan = p_nan;
          const CT x = input(g, s, d, Lay::contiguous, -2, 2);
          g.ties = false;
          g.p_nan = 0;
          const std::string what = fmt::format("p_nan {}", p_nan);
          check_reduce<kiln::op::ArgMax>(x, axis, what);
          check_reduce<kiln::op::ArgMin>(x, axis, what);
          check_reduce<kiln::op::Max>(x, axis, what);
          check_reduce<kiln::op::Min>(x, axis, what);
        }
  // a NaN only in the second half of a long row (a later piece), and at the very end
  for (int64_t at : {int64_t{39999}, int64_t{25000}, int64_t{7}}) {
    std::vector<double> v(40000, 1.0);
    v[100] = 5.0;
    v[30000] = 5.0;
    v[static_cast<size_t>(at)] = NAN;
    v[static_cast<size_t>(std::min<int64_t>(at + 1, 39999))] = NAN;
    const CT x = CT::from_vector(v, {1, 40000});
    check_reduce<kiln::op::ArgMax>(x, 1, fmt::format("NaN at {}", at));
    check_reduce<kiln::op::ArgMin>(x, 1, fmt::format("NaN at {}", at));
  }
  // ties across pieces: the maximum at several far-apart positions
  {
    std::vector<double> v(40000, 0.0);
    for (size_t i : {size_t{39000}, size_t{12000}, size_t{20000}}) v[i] = 3.0;
    const CT x = CT::from_vector(v, {1, 40000});
    check_reduce<kiln::op::ArgMax>(x, 1, "ties across pieces");
    const CT xt = CT::from_vector(v, {40000, 1});
    check_reduce<kiln::op::ArgMax>(xt, 0, "ties across pieces, strided");
  }
}

TEST_CASE("emu: gather and scatter_add, every dtype, i32/i64 index, out-of-range index throws", "[cuda-emu]") {
  kt::Gen g(18);
  for (DType d : kt::kAllDTypes)
    for (DType id : {DType::i64, DType::i32})
      for (int rep = 0; rep < 3; ++rep) {
        const Shape src_s{5, 6, 4};
        const int axis = static_cast<int>(g.integer(0, 2));
        Shape ix_s = src_s;
        ix_s[static_cast<size_t>(axis)] = g.integer(1, 8);
        const int64_t lim = src_s[static_cast<size_t>(axis)];
        const CT src = input(g, src_s, d, rep == 1 ? Lay::transposed : Lay::contiguous);
        const CT idx = input(g, ix_s, id, rep == 2 ? Lay::stepped : Lay::contiguous, 0, static_cast<double>(lim - 1));
        INFO(kiln::dtype_name(d) << " index " << kiln::dtype_name(id) << " axis " << axis);
        CT want = garbage(ix_s, d), got = garbage(ix_s, d);
        Cpu::gather(want.mview(), src.cview(), axis, idx.cview());
        cuda_emu::gather(buf(got), buf(src), axis, buf(idx));
        kt::check_bits(got, want, "gather");
        if (d == DType::boolean) continue;
        // scatter_add into a copy of out0
        const CT upd = input(g, ix_s, d, Lay::contiguous);
        const CT out0 = input(g, src_s, d, Lay::contiguous);
        CT w = out0.clone(), gt = out0.clone();
        Cpu::scatter_add(w.mview(), axis, idx.cview(), upd.cview());
        cuda_emu::scatter_add(buf(gt), axis, buf(idx), buf(upd));
        // colliding adds run in another order: each output gets at most ix_s[axis] adds of |x| <= 3
        const double adds = static_cast<double>(ix_s[static_cast<size_t>(axis)]) + 1;
        kt::check_close(gt, w, kt::Tol{0, adds * 3 * 2 * adds * std::max(kt::u_store(d), kt::u_acc(d))}, "scatter_add");
      }
  // out of range: an error naming the op, and the same condition on the Cpu
  for (int64_t bad : {int64_t{-1}, int64_t{5}}) {
    const CT src = CT::from_vector(std::vector<float>{1, 2, 3, 4, 5}, {5});
    const CT idx = CT::from_vector(std::vector<int64_t>{0, bad, 1}, {3});
    CT out = garbage({3}, DType::f32);
    CHECK_THROWS_WITH(cuda_emu::gather(buf(out), buf(src), 0, buf(idx)), Catch::Contains("gather") && Catch::Contains("out of range"));
    CHECK_THROWS(Cpu::gather(out.mview(), src.cview(), 0, idx.cview()));
    CT acc = CT::zeros({5});
    CHECK_THROWS_WITH(cuda_emu::scatter_add(buf(acc), 0, buf(idx), buf(src.narrow(0, 0, 3))),
                      Catch::Contains("scatter_add") && Catch::Contains("out of range"));
  }
}

TEST_CASE("emu: rand_uniform and rand_normal bit-identical to the Cpu, every dtype, strided outputs", "[cuda-emu]") {
  for (DType d : kt::kAllDTypes)
    for (const Shape& s : {Shape{1}, Shape{7}, Shape{4, 9}, Shape{3, 5, 11}, Shape{1000}, Shape{5001}})
      for (bool transposed : {false, true})
        for (uint64_t offset : {uint64_t{0}, uint64_t{12345}}) {
          INFO(kiln::dtype_name(d) << " " << kiln::shape_str(s) << (transposed ? " transposed" : "") << " offset " << offset);
          const auto out_of = [&](CT& base) {
            if (!transposed || s.size() < 2) return base;
            return base.transpose(0, static_cast<int64_t>(s.size()) - 1);
          };
          Shape bs = s;
          if (transposed && s.size() >= 2) std::swap(bs[0], bs.back());
          CT wb = garbage(bs, d), gb = garbage(bs, d);
          CT w = out_of(wb), gt = out_of(gb);
          Cpu::rand_uniform(w.mview(), 42, offset, -2.0, 3.0);
          cuda_emu::rand_uniform(buf(gt), 42, offset, -2.0, 3.0);
          kt::check_bits(gt, w, "rand_uniform");
          Cpu::rand_normal(w.mview(), 7, offset, 0.5, 2.0);
          cuda_emu::rand_normal(buf(gt), 7, offset, 0.5, 2.0);
          kt::check_bits(gt, w, "rand_normal");
        }
}

TEST_CASE("emu: fused softmax / log_softmax forward and backward (warp and block kernels)", "[cuda-emu]") {
  kt::Gen g(19);
  for (DType d : kt::kFloatDTypes)
    for (int64_t n : {1, 5, 64, 65, 256, 300, 1024, 1025, 3000})
      for (bool log : {false, true}) {
        const Shape s{3, n};
        const CT x = input(g, s, d, Lay::contiguous, -5, 5);
        INFO(kt::describe(s, d, Lay::contiguous) << (log ? " log_softmax" : " softmax"));
        CT want = garbage(s, d), got = garbage(s, d);
        Cpu::softmax_lastdim(want.mview(), x.cview(), log);
        cuda_emu::softmax_lastdim(buf(got), buf(x), log);
        const kt::Tol tol{8 * std::max(kt::u_store(d), 0x1p-23) + 4 * kt::u_store(d), 1e-6 + 4 * kt::u_store(d)};
        kt::check_close(got, want, tol, "softmax forward");
        const CT dy = input(g, s, d, Lay::contiguous);
        CT wdx = garbage(s, d), gdx = garbage(s, d);
        Cpu::softmax_lastdim_backward(wdx.mview(), want.cview(), dy.cview(), log);
        cuda_emu::softmax_lastdim_backward(buf(gdx), buf(want), buf(dy), log);
        const double nb = static_cast<double>(n) * 3 * 5 * std::max(kt::u_store(d), kt::u_acc(d));
        kt::check_close(gdx, wdx, kt::Tol{tol.rtol, nb + 1e-6}, "softmax backward");
      }
}

TEST_CASE("emu: fused rms_norm forward and backward", "[cuda-emu]") {
  kt::Gen g(20);
  for (DType d : {DType::f32, DType::f64})
    for (int64_t D : {1, 7, 64, 100, 1024, 1500})
      for (bool with_w : {true, false}) {
        const int64_t N = 37;
        const CT x = input(g, {N, D}, d, Lay::contiguous), w = input(g, {D}, d, Lay::contiguous);
        INFO(kiln::dtype_name(d) << " D " << D << (with_w ? " weight" : ""));
        CT wy = garbage({N, D}, d), gy = garbage({N, D}, d), wr = garbage({N}, d), gr = garbage({N}, d);
        const auto wv = w.cview();
        Cpu::rms_norm_forward(wy.mview(), wr.mview(), x.cview(), with_w ? &wv : nullptr, 1e-6);
        const cuda_emu::Buf wb = buf(w);
        cuda_emu::rms_norm_forward(buf(gy), buf(gr), buf(x), with_w ? &wb : nullptr, 1e-6);
        const double u = kt::u_acc(d), dd = static_cast<double>(D);
        kt::check_close(gr, wr, kt::Tol{4 * dd * u, 0}, "rstd");
        kt::check_close(gy, wy, kt::Tol{4 * dd * u, 4 * dd * u}, "y");
        const CT dy = input(g, {N, D}, d, Lay::contiguous);
        CT wdx = garbage({N, D}, d), gdx = garbage({N, D}, d), wdw = garbage({D}, d), gdw = garbage({D}, d);
        auto wdwm = wdw.mview();
        Cpu::rms_norm_backward(wdx.mview(), with_w ? &wdwm : nullptr, x.cview(), with_w ? &wv : nullptr, wr.cview(), dy.cview());
        const cuda_emu::Buf gdwb = buf(gdw);
        cuda_emu::rms_norm_backward(buf(gdx), with_w ? &gdwb : nullptr, buf(x), with_w ? &wb : nullptr, buf(wr), buf(dy));
        // dx = rstd (w dy - x rstd^2 mean(x w dy)): the terms' magnitudes bound the cancellation
        std::vector<double> bound(static_cast<size_t>(N * D));
        {
          const auto xv = x.to_vector<double>(), wv2 = w.to_vector<double>(), gv = dy.to_vector<double>(), rv = wr.to_vector<double>();
          for (int64_t i = 0; i < N; ++i) {
            double m = 0;
            for (int64_t j = 0; j < D; ++j)
              m += std::abs(xv[size_t(i * D + j)] * (with_w ? wv2[size_t(j)] : 1.0) * gv[size_t(i * D + j)]) / dd;
            const double r = rv[size_t(i)];
            for (int64_t j = 0; j < D; ++j)
              bound[size_t(i * D + j)] =
                  16 * (dd + 4) * u *
                  (r * std::abs((with_w ? wv2[size_t(j)] : 1.0) * gv[size_t(i * D + j)]) + std::abs(xv[size_t(i * D + j)]) * r * r * r * m);
          }
        }
        kt::check_close(gdx, wdx, kt::Tol{0, 0}, "dx", &bound);
        if (with_w) kt::check_close(gdw, wdw, kt::Tol{16 * N * u, 16 * N * u * 9 * 3}, "dw");
      }
}

TEST_CASE("emu: fused cross-entropy forward and backward", "[cuda-emu]") {
  kt::Gen g(21);
  for (DType d : {DType::f32, DType::f64})
    for (int64_t C : {1, 10, 300, 5000})
      for (double smoothing : {0.0, 0.1}) {
        const int64_t N = 9, ignore = -100;
        const CT x = input(g, {N, C}, d, Lay::contiguous, -4, 4);
        std::vector<int64_t> t(static_cast<size_t>(N));
        for (auto& v : t) v = g.coin(0.2) ? ignore : g.integer(0, C - 1);
        const CT tg = CT::from_vector(t, {N});
        INFO(kiln::dtype_name(d) << " C " << C << " smoothing " << smoothing);
        CT wl = garbage({N}, d), gl = garbage({N}, d), ws = garbage({N}, d), gs = garbage({N}, d);
        Cpu::cross_entropy_forward(wl.mview(), ws.mview(), x.cview(), tg.cview(), ignore, smoothing);
        cuda_emu::cross_entropy_forward(buf(gl), buf(gs), buf(x), buf(tg), ignore, smoothing);
        const double u = kt::u_acc(d), cc = static_cast<double>(C);
        kt::check_close(gs, ws, kt::Tol{4 * cc * u, 4 * cc * u}, "lse");
        kt::check_close(gl, wl, kt::Tol{8 * cc * u, 8 * 4 * cc * u}, "loss");
        const CT gg = input(g, {N}, d, Lay::contiguous);
        CT wd = garbage({N, C}, d), gd = garbage({N, C}, d);
        Cpu::cross_entropy_backward(wd.mview(), x.cview(), ws.cview(), tg.cview(), gg.cview(), ignore, smoothing);
        cuda_emu::cross_entropy_backward(buf(gd), buf(x), buf(ws), buf(tg), buf(gg), ignore, smoothing);
        kt::check_close(gd, wd, kt::Tol{8 * u * 16, 8 * u * 16}, "dlogits");
      }
}

TEST_CASE("emu: threads scheduled in reverse order (a missing barrier changes the answer)", "[cuda-emu]") {
  struct Restore {
    ~Restore() { cuda_emu::set_reverse_order(false); }
  } restore;
  cuda_emu::set_reverse_order(true);
  kt::Gen g(22);
  reduce_cases(g, true);
  for (DType d : {DType::f32, DType::f64})
    for (int64_t n : {5, 300, 3000}) {
      const CT x = input(g, {4, n}, d, Lay::contiguous, -5, 5);
      INFO("softmax " << kiln::dtype_name(d) << " n " << n);
      CT want = garbage(x.shape(), d), got = garbage(x.shape(), d);
      Cpu::softmax_lastdim(want.mview(), x.cview(), false);
      cuda_emu::softmax_lastdim(buf(got), buf(x), false);
      kt::check_close(got, want, kt::Tol{16 * kt::u_acc(d) + 1e-300, 1e-6}, "softmax, reverse order");
      CT wy = garbage(x.shape(), d), gy = garbage(x.shape(), d), wr = garbage({4}, d), gr = garbage({4}, d);
      Cpu::rms_norm_forward(wy.mview(), wr.mview(), x.cview(), nullptr, 1e-6);
      cuda_emu::rms_norm_forward(buf(gy), buf(gr), buf(x), nullptr, 1e-6);
      kt::check_close(gr, wr, kt::Tol{4 * static_cast<double>(n) * kt::u_acc(d), 0}, "rms_norm rstd, reverse order");
    }
}

TEST_CASE("emu: edge shapes (empty axis, no outputs, 0-d gather and scatter_add)", "[cuda-emu]") {
  kt::Gen g(23);
  // reductions over an empty axis, and with no outputs: the same result or the same refusal
  for (const auto& [s, axis] : std::vector<std::pair<Shape, int>>{{{3, 0}, 1}, {{0, 4}, 0}, {{0, 40}, 1}, {{2, 0, 3}, 1}, {{0}, 0}})
    for (DType d : {DType::f32, DType::i64}) {
      const CT x = CT::zeros(s, d);
      every_reduce_op([&]<class Op>(kiln::type_tag<Op>) {
        Shape os = s;
        os[static_cast<size_t>(axis)] = 1;
        const DType od = Op::index ? DType::i64 : d;
        CT want = garbage(os, od), got = garbage(os, od);
        INFO(Op::name << " over axis " << axis << " of " << kiln::shape_str(s) << " " << kiln::dtype_name(d));
        bool cpu_threw = false, emu_threw = false;
        try {
          Cpu::reduce<Op>(want.mview(), x.cview(), axis);
        } catch (const std::exception&) {
          cpu_threw = true;
        }
        try {
          cuda_emu::reduce(Op::name, buf(got), buf(x), axis);
        } catch (const std::exception&) {
          emu_threw = true;
        }
        CHECK(cpu_threw == emu_threw);
        if (!cpu_threw && !emu_threw) kt::check_bits(got, want, Op::name);
      });
    }
  // 0-d source / output
  for (DType d : {DType::f32, DType::i32, DType::bf16}) {
    const CT src = CT::full({}, kiln::Scalar(2.5), d);
    // gather from a 0-d source copies it
    CT w0 = garbage({}, d), g0 = garbage({}, d);
    const CT idx0 = CT::zeros({}, DType::i64);
    Cpu::gather(w0.mview(), src.cview(), 0, idx0.cview());
    cuda_emu::gather(buf(g0), buf(src), 0, buf(idx0));
    kt::check_bits(g0, w0, "gather 0-d");
    CT ws = CT::full({}, kiln::Scalar(1.0), d), gs = CT::full({}, kiln::Scalar(1.0), d);
    // (Tensor::scatter_add requires index and src of the output's rank: all three 0-d)
    const CT upd = input(g, {}, d, Lay::contiguous);
    Cpu::scatter_add(ws.mview(), 0, idx0.cview(), upd.cview());
    cuda_emu::scatter_add(buf(gs), 0, buf(idx0), buf(upd));
    kt::check_close(gs, ws, kt::Tol{0, 16 * std::max(kt::u_store(d), kt::u_acc(d)) * 10}, "scatter_add into 0-d");
  }
}

TEST_CASE("emu: the emulator itself (launch counting, deadlock-free barriers)", "[cuda-emu]") {
  const uint64_t before = cuda_emu::launches();
  CT x = CT::from_vector(std::vector<float>(1000, 1.0f), {1000});
  CT out = garbage({1}, DType::f32);
  cuda_emu::reduce("sum", buf(out), buf(x), 0);
  CHECK(out.to_vector<float>()[0] == 1000.0f);
  CHECK(cuda_emu::launches() > before);
}

// Attention Residuals' depth attention (depth.cu) against the Cpu kernels (backends/cpu/depth.cpp):
// forward (h, α, rstd), backward (every dv_i, dq: N = 150 and 300 span several dq row chunks), Phase 1 of
// two-phase inference for S queries, and the merge with and without a running partial.
TEST_CASE("emu: fused depth attention forward, backward, phase 1 and merge", "[cuda-emu]") {
  kt::Gen g(24);
  struct Case {
    DType d;
    int64_t N, D;
    int n;
  };
  std::vector<Case> cases{{DType::f32, 300, 100, 3}, {DType::f64, 150, 64, 2}};  // several dq row chunks
  for (DType d : {DType::f32, DType::f64})
    for (int64_t D : {1, 7, 100})
      for (int n : {1, 3, 9}) cases.push_back({d, (D + n) % 2 ? 1 : 13, D, n});
  for (const auto& [d, N, D, n] : cases) {
    INFO(kiln::dtype_name(d) << " N " << N << " D " << D << " sources " << n);
    std::vector<CT> v;
    std::vector<cuda_emu::Buf> vb;
    for (int i = 0; i < n; ++i) {
      v.push_back(input(g, {N, D}, d, Lay::contiguous, -2, 2));
      vb.push_back(buf(v.back()));
    }
    std::vector<kiln::View<kiln::HostStorage>> vv;
    for (const CT& t : v) vv.push_back(t.cview());
    const CT q = input(g, {D}, d, Lay::contiguous, -1, 1);
    const double u = kt::u_acc(d), k = static_cast<double>(D + n);
    const kt::Tol tol{32 * k * u, 32 * k * u};
    // forward
    CT wh = garbage({N, D}, d), gh = garbage({N, D}, d), wa = garbage({n, N}, d), ga = garbage({n, N}, d), wr = garbage({n, N}, d),
       gr = garbage({n, N}, d);
    Cpu::depth_attention_forward(wh.mview(), wa.mview(), wr.mview(), vv, q.cview(), 1e-5);
    cuda_emu::depth_attention_forward(buf(gh), buf(ga), buf(gr), vb, buf(q), 1e-5);
    kt::check_close(gr, wr, tol, "rstd");
    kt::check_close(ga, wa, tol, "alpha");
    kt::check_close(gh, wh, tol, "h");
    // backward from the Cpu's saved statistics
    const CT dh = input(g, {N, D}, d, Lay::contiguous, -1, 1);
    std::vector<CT> wdv, gdv;
    std::vector<kiln::MutView<kiln::HostStorage>> wdvm;
    std::vector<cuda_emu::Buf> gdvb;
    for (int i = 0; i < n; ++i) {
      wdv.push_back(garbage({N, D}, d));
      gdv.push_back(garbage({N, D}, d));
    }
    for (CT& t : wdv) wdvm.push_back(t.mview());
    for (const CT& t : gdv) gdvb.push_back(buf(t));
    CT wdq = garbage({D}, d), gdq = garbage({D}, d);
    Cpu::depth_attention_backward(wdvm, wdq.mview(), vv, q.cview(), wa.cview(), wr.cview(), dh.cview());
    cuda_emu::depth_attention_backward(gdvb, buf(gdq), vb, buf(q), buf(wa), buf(wr), buf(dh));
    for (int i = 0; i < n; ++i) kt::check_close(gdv[static_cast<size_t>(i)], wdv[static_cast<size_t>(i)], tol, "dv");
    kt::check_close(gdq, wdq, kt::Tol{32 * (k + static_cast<double>(N)) * u, 32 * (k + static_cast<double>(N)) * u * n}, "dq");
    // Phase 1 with S queries, then the merge of each with and without a partial
    for (int64_t S : {1, 3}) {
      const CT Q = input(g, {S, D}, d, Lay::contiguous, -1, 1);
      CT wm = garbage({S, N}, d), gm = garbage({S, N}, d), wl = garbage({S, N}, d), gl = garbage({S, N}, d), wacc = garbage({S, N, D}, d),
         gacc = garbage({S, N, D}, d);
      Cpu::depth_attention_phase1(wm.mview(), wl.mview(), wacc.mview(), vv, Q.cview(), 1e-5);
      cuda_emu::depth_attention_phase1(buf(gm), buf(gl), buf(gacc), vb, buf(Q), 1e-5);
      kt::check_close(gm, wm, tol, "phase 1 m");
      kt::check_close(gl, wl, tol, "phase 1 l");
      kt::check_close(gacc, wacc, tol, "phase 1 acc");
      const CT p = input(g, {N, D}, d, Lay::contiguous, -2, 2);
      for (bool with_p : {false, true}) {
        const CT m0 = wm.select(0, S - 1), l0 = wl.select(0, S - 1), a0 = wacc.select(0, S - 1), q0 = Q.select(0, S - 1);
        CT wmh = garbage({N, D}, d), gmh = garbage({N, D}, d);
        const auto pv = p.cview();
        Cpu::depth_attention_merge(wmh.mview(), m0.cview(), l0.cview(), a0.cview(), with_p ? &pv : nullptr, q0.cview(), 1e-5);
        const cuda_emu::Buf pb = buf(p);
        cuda_emu::depth_attention_merge(buf(gmh), buf(m0), buf(l0), buf(a0), with_p ? &pb : nullptr, buf(q0), 1e-5);
        kt::check_close(gmh, wmh, tol, with_p ? "merge with a partial" : "merge without a partial");
      }
    }
  }
  // more sources than the kernel takes: a clear error
  const CT x = CT::zeros({2, 4});
  std::vector<cuda_emu::Buf> many(129, buf(x));
  CT h = garbage({2, 4}, DType::f32), a = garbage({129, 2}, DType::f32), r = garbage({129, 2}, DType::f32);
  CHECK_THROWS_WITH(cuda_emu::depth_attention_forward(buf(h), buf(a), buf(r), many, buf(CT::zeros({4})), 1e-5),
                    Catch::Contains("depth_attention") && Catch::Contains("129"));
}

// Multi-tensor Adam/AdamW (optim.cu) against the Cpu's fused step: more tensors than one launch packs
// (48), sizes across the 4096-element tiles, f32 and f64 mixed, Adam (L2) and AdamW (decoupled).
TEST_CASE("emu: multi-tensor Adam and AdamW steps", "[cuda-emu]") {
  kt::Gen g(25);
  for (const bool decoupled : {true, false}) {
    INFO((decoupled ? "AdamW" : "Adam with L2"));
    std::vector<CT> wc, mc, vc, gc, we, me, ve;
    for (int i = 0; i < 53; ++i) {
      const DType d = i % 5 == 0 ? DType::f64 : DType::f32;
      const int64_t n = i == 3 ? 9000 : i == 7 ? 4096 : i == 11 ? 0 : 1 + g.integer(0, 300);
      const CT w = input(g, {n}, d, Lay::contiguous), m = input(g, {n}, d, Lay::contiguous, -0.1, 0.1),
               v = input(g, {n}, d, Lay::contiguous, 0, 0.01), gr = input(g, {n}, d, Lay::contiguous);
      wc.push_back(w.clone());
      mc.push_back(m.clone());
      vc.push_back(v.clone());
      we.push_back(w.clone());
      me.push_back(m.clone());
      ve.push_back(v.clone());
      gc.push_back(gr);
    }
    kiln::fused::AdamHyper h;
    h.lr = 3e-3;
    h.weight_decay = 0.1;
    h.decoupled = decoupled;
    h.bc1 = 1 - std::pow(h.beta1, 3);
    h.bc2_sqrt = std::sqrt(1 - std::pow(h.beta2, 3));
    std::vector<kiln::MutView<kiln::HostStorage>> wm, mm, vm;
    std::vector<kiln::View<kiln::HostStorage>> gv;
    std::vector<cuda_emu::Buf> wb, mb, vb, gb;
    for (size_t i = 0; i < wc.size(); ++i) {
      wm.push_back(wc[i].mview());
      mm.push_back(mc[i].mview());
      vm.push_back(vc[i].mview());
      gv.push_back(gc[i].cview());
      wb.push_back(buf(we[i]));
      mb.push_back(buf(me[i]));
      vb.push_back(buf(ve[i]));
      gb.push_back(buf(gc[i]));
    }
    Cpu::adam_step(wm, mm, vm, gv, h);
    cuda_emu::adam_step(wb, mb, vb, gb, {h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.decoupled, h.bc1, h.bc2_sqrt});
    for (size_t i = 0; i < wc.size(); ++i) {
      INFO("parameter " << i << " " << kiln::dtype_name(wc[i].dtype()) << " [" << wc[i].numel() << "]");
      const double u = kt::u_acc(wc[i].dtype());
      kt::check_close(me[i], mc[i], kt::Tol{8 * u, 8 * u}, "m");
      kt::check_close(ve[i], vc[i], kt::Tol{8 * u, 8 * u}, "v");
      kt::check_close(we[i], wc[i], kt::Tol{8 * u, 64 * u * h.lr}, "w");
    }
  }
}

// Flash attention (attention.cu, dynamic shared memory) against the Cpu's flash kernel: MHA and GQA,
// value width = key width and 2x (differential attention's), causal with a KV-cache offset, key
// padding (a fully padded batch row gives NaN / -inf like the Cpu), an attention mask (none, bool
// [T, S] broadcast over B and H, additive [B, 1, 1, S] with −inf entries, read through zero strides),
// forward and backward; tiles cross the 64-row boundaries (T, S up to 130); f32 on the tensor-core
// kernels (head dims 8 to 128) and on the FMA kernels.
TEST_CASE("emu: flash attention forward and backward", "[cuda-emu]") {
  kt::Gen g(26);
  struct Case {
    DType dt;
    int64_t B, H, Hkv, T, S, d, dv;
    bool causal;
    int64_t pos0;
    bool padding;
  };
  const std::vector<Case> cases{
      {DType::f32, 1, 2, 2, 5, 5, 8, 8, true, 0, false},       {DType::f64, 2, 4, 2, 7, 9, 16, 32, true, 2, true},
      {DType::f32, 1, 2, 1, 70, 70, 32, 64, true, 0, false},   {DType::f32, 1, 1, 1, 3, 66, 64, 64, false, 0, true},
      {DType::f64, 1, 2, 1, 1, 40, 128, 128, true, 39, false}, {DType::f32, 1, 2, 1, 67, 75, 16, 128, true, 8, true},
      {DType::f32, 1, 1, 1, 9, 130, 128, 8, false, 0, false},  {DType::f32, 1, 2, 2, 20, 20, 12, 8, true, 0, false}};
  // f32 with head dims that are multiples of 8 up to 128 runs on the tensor-core kernels, and once more
  // on the FMA kernels
  for (int pass = 0; pass < 2; ++pass)
    for (const auto& [dt, B, H, Hkv, T, S, d, dv, causal, pos0, padding] : cases) {
      const bool tc = pass == 0;
      if (!tc && dt != DType::f32) continue;
      cuda_emu::set_attention_tensor_cores(tc);
      INFO((tc ? "tensor cores where they fit, " : "FMA kernels, ")
           << kiln::dtype_name(dt) << " B " << B << " H " << H << "/" << Hkv << " T " << T << " S " << S << " d " << d << " dv " << dv
           << (causal ? " causal" : "") << " pos0 " << pos0 << (padding ? " padding" : ""));
      const CT q = input(g, {B, H, T, d}, dt, Lay::contiguous, -1, 1), k = input(g, {B, Hkv, S, d}, dt, Lay::contiguous, -1, 1),
               v = input(g, {B, Hkv, S, dv}, dt, Lay::contiguous, -1, 1), dout = input(g, {B, H, T, dv}, dt, Lay::contiguous, -1, 1);
      std::vector<uint8_t> pad(static_cast<size_t>(B * S), 0);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t s = 0; s < S; ++s) pad[static_cast<size_t>(b * S + s)] = padding && (s % 3 == 1 || (B > 1 && b == 1 && s < S));
      CT kp = CT::empty({B, S}, DType::boolean);
      std::memcpy(kp.storage()->data(), pad.data(), pad.size());
      const auto kpv = kp.cview();
      const cuda_emu::Buf kpb = buf(kp);
      const double scale = 1.0 / std::sqrt(static_cast<double>(d));
      const DType ld = dt == DType::f64 ? DType::f64 : DType::f32;
      // the mask kind cycles with the case: 0 none, 1 bool [T, S], 2 additive [B, 1, 1, S]
      const int mkind = static_cast<int>((T + S) % 3);
      CT mask;
      if (mkind == 1) {
        std::vector<uint8_t> m(static_cast<size_t>(T * S));
        for (int64_t i = 0; i < T; ++i)
          for (int64_t j = 0; j < S; ++j) m[static_cast<size_t>(i * S + j)] = (i + 2 * j) % 5 != 3 || j == 0;
        mask = CT::empty({T, S}, DType::boolean);
        std::memcpy(mask.storage()->data(), m.data(), m.size());
        mask = mask.unsqueeze(0).unsqueeze(0).expand({B, H, T, S});
      } else if (mkind == 2) {
        mask = input(g, {B, 1, 1, S}, dt, Lay::contiguous, -2, 1);
        mask.narrow(3, S / 2, 1).fill_(-INFINITY);
        mask = mask.expand({B, H, T, S});
      }
      const auto mv = mkind ? mask.cview() : q.cview();
      const cuda_emu::Buf mb = mkind ? buf(mask) : buf(q);
      INFO("mask kind " << mkind);
      CT wo = garbage({B, H, T, dv}, dt), go = garbage({B, H, T, dv}, dt), wl = garbage({B, H, T}, ld), gl = garbage({B, H, T}, ld);
      Cpu::attention_forward(wo.mview(), wl.mview(), q.cview(), k.cview(), v.cview(), padding ? &kpv : nullptr, mkind ? &mv : nullptr,
                             scale, causal, pos0, 0.0);
      cuda_emu::attention_forward(buf(go), buf(gl), buf(q), buf(k), buf(v), padding ? &kpb : nullptr, mkind ? &mb : nullptr, scale, causal,
                                  pos0);
      const double u = kt::u_acc(dt), n = static_cast<double>(S + d + dv);
      const kt::Tol tol{32 * n * u, 32 * n * u};
      kt::check_close(gl, wl, tol, "lse");
      kt::check_close(go, wo, tol, "o");
      CT wdq = CT::zeros({B, H, T, d}, dt), gdq = CT::zeros({B, H, T, d}, dt), wdk = CT::zeros({B, Hkv, S, d}, dt),
         gdk = CT::zeros({B, Hkv, S, d}, dt), wdv = CT::zeros({B, Hkv, S, dv}, dt), gdv = CT::zeros({B, Hkv, S, dv}, dt);
      Cpu::attention_backward(wdq.mview(), wdk.mview(), wdv.mview(), q.cview(), k.cview(), v.cview(), wo.cview(), wl.cview(), dout.cview(),
                              padding ? &kpv : nullptr, mkind ? &mv : nullptr, scale, causal, pos0, 0.0);
      cuda_emu::attention_backward(buf(gdq), buf(gdk), buf(gdv), buf(q), buf(k), buf(v), buf(wo), buf(wl), buf(dout),
                                   padding ? &kpb : nullptr, mkind ? &mb : nullptr, scale, causal, pos0);
      const kt::Tol btol{64 * n * u * (H / Hkv), 64 * n * u * static_cast<double>(T) * (H / Hkv)};
      kt::check_close(gdq, wdq, btol, "dq");
      kt::check_close(gdk, wdk, btol, "dk");
      kt::check_close(gdv, wdv, btol, "dv");
    }
  cuda_emu::set_attention_tensor_cores(true);
}
