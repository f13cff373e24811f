// Mixed precision (autograd/autocast.hpp, docs/mixed_precision.md): the autocast scope, the op lists
// against torch.autocast (tests/amp/amp_ref.py), bit-identity when autocast is off, the casts'
// backward, one GPT training step against torch.autocast("cpu", bfloat16), the loss scaler, and
// `kiln train` with "precision": "bf16" (the 300-step comparison with f32 is [slow]).
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <kiln/autograd/autocast.hpp>
#include <kiln/backends/backends.hpp>
#include <kiln/core/profile.hpp>
#include <kiln/formats/safetensors.hpp>
#include <kiln/nn/conv.hpp>
#include <kiln/nn/gpt.hpp>
#include <kiln/nn/linear.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/nn/norm.hpp>
#include <kiln/optim/optimizer.hpp>
#include <kiln/train/data.hpp>
#include <kiln/train/loop.hpp>
#include <kiln/train/trainer.hpp>

#include "common/kiln_test.hpp"
#include "common/python.hpp"

using namespace kiln;
using json = nlohmann::json;
using T = Tensor<Cpu>;
using V = Var<Cpu>;

namespace {

// bf16 has 8 significant bits: one rounding to nearest moves a value by at most kBf16U = 2^-8 relative.
// kU = 2^-9 is the unit the model-level tolerances below are written in.
constexpr double kBf16U = 0x1p-8;
constexpr double kU = 0x1p-9;

double rel_l2(const T& a, const T& b) {
  const T x = a.to(DType::f64), y = b.to(DType::f64);
  const double num = std::sqrt(item<double>(x.sub(y).square().sum()));
  const double den = std::sqrt(item<double>(y.square().sum()));
  return den == 0 ? num : num / den;
}

// A fresh directory under the system's temporary directory, removed with its contents when the test
// case ends, passed or failed.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag) {
    static int n = 0;
    path = std::filesystem::temp_directory_path() / fmt::format("kiln-amp-{}-{}-{}", tag, ::getpid(), n++);
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::filesystem::path operator/(const std::string& name) const { return path / name; }
  std::string string() const { return path.string(); }
};
TempDir temp_dir(const std::string& tag) { return TempDir(tag); }

void require_torch() {
  if (std::system(fmt::format("{} -c 'import torch' >/dev/null 2>&1", test::python()).c_str()) != 0)
    FAIL("PyTorch for " << test::python() << " is missing: run scripts/setup.sh --python, or set KILN_PYTHON");
}

void run_py(const std::string& script, const std::string& args) {
  // torch runs as it would on this CPU: a oneDNN limit set for kiln (ONEDNN_MAX_CPU_ISA=AVX2, to try
  // kiln's AVX2 path) would make torch 1.13, which picks its bf16 GEMM from the CPU, fail to create it.
  const std::string cmd =
      fmt::format("OMP_NUM_THREADS=2 KILN_REFERENCE_DIR={} env -u ONEDNN_MAX_CPU_ISA -u DNNL_MAX_CPU_ISA {} {} {} >/dev/null",
                  KILN_REFERENCE_DIR, test::python(), script, args);
  INFO(cmd);
  REQUIRE(std::system(cmd.c_str()) == 0);
}
std::string amp_script() { return std::string(KILN_SOURCE_DIR) + "/tests/amp/amp_ref.py"; }

// Elementwise: |got - want| <= rel·|want| + abs, where want is torch's; reports the worst element.
void check_rel(const T& got, const T& want, double rel, double abs, const std::string& what) {
  INFO(what);
  REQUIRE(got.shape() == want.shape());
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double excess = std::abs(g[i] - w[i]) - (rel * std::abs(w[i]) + abs);
    if (excess > worst) {
      worst = excess;
      at = i;
    }
  }
  INFO("worst element " << at << ": got " << g[at] << " want " << w[at]);
  CHECK(worst == 0);
}

}  // namespace

TEST_CASE("amp: the autocast scope is per thread, nestable, and can be turned off inside", "[amp]") {
  CHECK_FALSE(autocast::enabled());
  CHECK(autocast::dtype() == DType::f32);
  {
    autocast::Scope a(DType::bf16);
    CHECK(autocast::enabled());
    CHECK(autocast::dtype() == DType::bf16);
    {
      autocast::Scope off(DType::bf16, false);
      CHECK_FALSE(autocast::enabled());
      {
        autocast::Scope h(DType::f16);
        CHECK(autocast::dtype() == DType::f16);
      }
      CHECK_FALSE(autocast::enabled());
    }
    {
      autocast::Scope f(DType::f32);
      CHECK_FALSE(autocast::enabled());
    }
    CHECK(autocast::dtype() == DType::bf16);
  }
  CHECK_FALSE(autocast::enabled());
  CHECK_THROWS_WITH(autocast::Scope(DType::f64), Catch::Contains("autocast::Scope") && Catch::Contains("f64"));
  CHECK_THROWS_WITH(autocast::Scope(DType::i32), Catch::Contains("bf16, f16 or f32"));
}

// A bf16-output GEMM with f32 accumulation, against the exact product of its bf16 operands: the f32 sum
// of K products is within K·2^-24·Σ|a||b| of the exact one (γ_K, any summation order, FMA or not), and
// rounding it to bf16 adds at most u = 2^-8 relative (8 significant bits, round to nearest). So, per
// element, |got - exact| <= u·|exact| + 2·K·2^-24·(|a|·|b|), whichever kernel ran (oneDNN's bf16 GEMM
// where the CPU has AVX512-BF16 or AMX, else sgemm on the operands converted to f32). A GEMM that sums in
// bf16 (u per addition) is far outside it. Returns the worst ratio of error to bound (<= 1 passes).
struct GemmBound {
  T exact, slack;                                            // f64
  GemmBound(const T& a, const T& b, double extra_rel = 0) {  // a, b: the bf16-rounded operands
    const T a64 = a.to(DType::f64), b64 = b.to(DType::f64);
    exact = a64.matmul(b64);
    const double acc = 2.0 * static_cast<double>(a.size(-1)) * 0x1p-24;
    slack = exact.abs().mul(kBf16U + extra_rel).add(a64.abs().matmul(b64.abs()).mul(acc));
  }
  double worst(const T& got) const {
    const std::vector<double> g = got.to_vector<double>(), e = exact.to_vector<double>(), sl = slack.to_vector<double>();
    double r = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      const double err = std::abs(g[i] - e[i]);
      r = std::max(r, sl[i] > 0 ? err / sl[i] : err > 0 ? INFINITY : 0.0);
    }
    return r;
  }
};

T bf16_rounded(const T& x) { return x.to(DType::bf16).to(DType::f32); }

float round_bf16(float x) {  // to nearest, ties to even (finite x)
  uint32_t u = std::bit_cast<uint32_t>(x);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  return std::bit_cast<float>(u);
}

// A wrong GEMM for the bound to reject: c[i][j] kept in bf16, c = bf16(c + a·b) per product (the
// summation torch 1.13's own bf16 GEMM does on CPUs without oneDNN's bf16 kernels).
T gemm_bf16_accumulated(const T& a, const T& b) {
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  const std::vector<float> av = a.contiguous().to_vector<float>(), bv = b.contiguous().to_vector<float>();
  std::vector<float> c(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      float s = 0;
      for (int64_t k = 0; k < K; ++k) s = round_bf16(s + av[static_cast<size_t>(i * K + k)] * bv[static_cast<size_t>(k * N + j)]);
      c[static_cast<size_t>(i * N + j)] = s;
    }
  return T::from_vector(c, {M, N});
}

TEST_CASE("amp: matmul, linear and the f32 list under autocast match torch.autocast", "[amp][torch]") {
  require_torch();
  const auto dir = temp_dir("ops");
  const std::string f = (dir / "ops.safetensors").string();
  run_py(amp_script(), fmt::format("ops --seed 7 --out {}", f));
  const auto r = safetensors::load<Cpu>(f);
  const T a = r.at("in.a"), b = r.at("in.b"), w = r.at("in.w"), bias = r.at("in.bias"), xb = r.at("in.xb").to(DType::bf16);
  const int64_t K = a.size(1), N = b.size(1);
  WARN("bf16 matmul on this CPU: " << (native_bf16_matmul() ? "oneDNN's bf16 kernels"
                                                            : "f32 sgemm, output rounded once (no AVX512-BF16/AMX, or forced)")
                                   << "; both are checked against the exact product of the bf16 operands");

  V av(a, true), bv(b, true);
  V mm, lin;
  {
    autocast::Scope ac(DType::bf16);
    mm = av.matmul(bv);
    nn::Linear<Cpu> l(nn::LinearOptions{.in = K, .out = N, .bias = true});
    T(l.named_parameters()[0].second.value()).copy_(w);
    T(l.named_parameters()[1].second.value()).copy_(bias);
    lin = l.forward(V(a));
  }
  CHECK(mm.dtype() == DType::bf16);
  CHECK(lin.dtype() == DType::bf16);
  // The gradient through the casts: dy = bf16(gw) per column; dy @ bᵀ and aᵀ @ dy are bf16 GEMMs, cast to f32.
  (mm.to(DType::f32) * V(r.at("in.gw"))).sum().backward();
  CHECK(av.grad().dtype() == DType::f32);
  CHECK(bv.grad().dtype() == DType::f32);
  const T ab = bf16_rounded(a), bb = bf16_rounded(b), dy = bf16_rounded(r.at("in.gw").reshape({1, N}).expand({a.size(0), N}).contiguous());
  // linear: kiln rounds x·Wᵀ to bf16, then adds the bf16 bias and rounds again (torch adds the bias inside
  // the GEMM, one rounding): u·|x·Wᵀ| more, plus u·|x·Wᵀ + b| for the second rounding, below as 2u·(|x·Wᵀ| + |b|).
  struct Case {
    std::string name;
    V got;
    GemmBound bound;
    T wrong;  // the same product summed in bf16
  };
  GemmBound lin_bound(ab, bf16_rounded(w).t().contiguous(), kBf16U);
  lin_bound.exact = lin_bound.exact.add(bf16_rounded(bias).to(DType::f64));
  lin_bound.slack = lin_bound.slack.add(bf16_rounded(bias).to(DType::f64).abs().mul(2 * kBf16U));
  const T wt = bf16_rounded(w).t().contiguous();
  const std::vector<Case> cases = {
      {"mm", mm.to(DType::f32), GemmBound(ab, bb), gemm_bf16_accumulated(ab, bb)},
      {"linear", lin.to(DType::f32), lin_bound, gemm_bf16_accumulated(ab, wt).add(bf16_rounded(bias))},
      {"mm.grad_a", V(av.grad()), GemmBound(dy, bb.t().contiguous()), gemm_bf16_accumulated(dy, bb.t().contiguous())},
      {"mm.grad_b", V(bv.grad()), GemmBound(ab.t().contiguous(), dy), gemm_bf16_accumulated(ab.t().contiguous(), dy)}};
  for (const Case& c : cases) {
    INFO(c.name);
    // kiln: within the bound on every CPU.
    CHECK(c.bound.worst(c.got.value()) <= 1.0);
    // The bound rejects a wrong product: one element 2 bf16 ulps off, and the product summed in bf16.
    T off = c.got.value().clone();
    const std::vector<double> ex = c.bound.exact.to_vector<double>();
    const auto big = static_cast<size_t>(
        std::max_element(ex.begin(), ex.end(), [](double x, double y) { return std::abs(x) < std::abs(y); }) - ex.begin());
    std::vector<float> ov = off.to_vector<float>();
    ov[big] += static_cast<float>(std::ldexp(1.0, std::ilogb(ov[big]) - 6));  // 2 ulps of bf16 (8 significant bits)
    off = T::from_vector(ov, off.shape());
    CHECK(c.bound.worst(off) > 1.0);
    CHECK(c.bound.worst(c.wrong) > 1.0);
    // torch.autocast, as it runs on this CPU and with oneDNN off (".fallback", torch 1.13's own bf16 GEMM,
    // the path of CPUs without AVX-512): where a result meets the bound, it checks the oracle's semantics
    // (operands rounded to bf16, the output rounded once) against torch's. Where it does not, torch summed
    // in bf16: said, and its result must still be the same product within the bound of a bf16 sum
    // (K·u·Σ|a||b| <= 2^15 · the slack), i.e. the same operands, transposes and casts.
    for (const std::string tag : {"", ".fallback"}) {
      const T want = r.at("out." + c.name + tag);
      if (const double t = c.bound.worst(want); t > 1.0) {
        WARN("torch.autocast's " << c.name << tag << " accumulates in bf16 here (error " << t
                                 << "x the f32-accumulation bound): kiln is checked against the exact product");
        const std::vector<double> g = want.to_vector<double>(), sl = c.bound.slack.to_vector<double>();
        double worst = 0;
        for (size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::abs(g[i] - ex[i]) / (sl[i] * 0x1p15));
        CHECK(worst <= 1.0);
      }
    }
  }

  // The f32 list takes bf16 in and gives f32 out, equal to the op on the input cast up (f32 rounding).
  autocast::Scope ac(DType::bf16);
  const V x(xb);
  const T t = r.at("in.t");
  const std::vector<std::pair<std::string, V>> f32_ops = {
      {"softmax", x.softmax(-1)},
      {"log_softmax", x.log_softmax(-1)},
      {"cross_entropy", nn::cross_entropy(x, t).reshape({1})},
      {"sum", x.sum({-1})},
      {"mean", x.mean({0})},
      {"exp", x.div(4.0).exp()},
      {"layer_norm", nn::functional::layer_norm(x, V(), V(), 1e-5)},
  };
  for (const auto& [name, y] : f32_ops) {
    INFO(name);
    CHECK(y.dtype() == DType::f32);
    check_rel(y.value(), r.at("out." + name), 1e-5, 1e-5, name);
  }
  // rms_norm has no torch 1.13 op: the same contract against its f32 self.
  const V rn = nn::functional::rms_norm(x, V(), 1e-6);
  CHECK(rn.dtype() == DType::f32);
  kt::check_bits(rn.value(), nn::functional::rms_norm(V(xb.to(DType::f32)), V(), 1e-6).value(), "rms_norm");
}

namespace {

// f64 of the bf16 rounding of t: the operands the low-precision ops compute on.
T rounded(const T& t) { return t.to(DType::bf16).to(DType::f64); }

// The result of an f32 accumulation of K products rounded once to bf16, against the exact sum e of
// the same bf16 operands: |got − e| <= u·|e| + 1.01·γ_K·S (u = kBf16U), where S = Σ|products| (+|bias|) and
// γ_K = K·2^-24 bounds an f32 sum of K terms in any order (Higham): whatever the kernel and the
// CPU's instruction set. One rounding more (a bias added to a rounded product, an operand left
// unrounded) breaks it wherever the terms cancel.
void check_low(const T& got, const T& exact, const T& abs_sum, int64_t K, const std::string& what) {
  INFO(what << " (K = " << K << ")");
  REQUIRE(got.shape() == exact.shape());
  const std::vector<double> g = got.to_vector<double>(), e = exact.to_vector<double>(), a = abs_sum.to_vector<double>();
  const double gamma = 1.01 * static_cast<double>(K) * 0x1p-24;
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double excess = std::abs(g[i] - e[i]) - (kBf16U * std::abs(e[i]) + gamma * a[i]);
    if (excess > worst) worst = excess, at = i;
  }
  INFO("worst element " << at << ": got " << g[at] << ", exact " << e[at] << ", Σ|terms| " << a[at]);
  CHECK(worst == 0);
}

}  // namespace

// conv2d and conv_transpose2d follow PyTorch's autocast policy (the low list): every floating operand
// rounded to bf16, f32 compute, the output (bias included) rounded once, the gradients the same way
// and then cast back to the f32 leaves. Oracles: kiln's own float64 convolution of the bf16-rounded
// operands (exact up to 2^-53), with the bound of check_low; and torch.autocast's conv2d, held to the
// same bound around the same exact sums. 1.13's CPU autocast keeps conv_transpose2d in f32, so torch
// runs it as later PyTorch's autocast does, by hand (bf16 operands, f32 compute, bf16 results); conv2d
// too where torch has no bf16 convolution (CPUs below AVX-512: tests/amp/amp_ref.py).
TEST_CASE("amp: conv2d and conv_transpose2d under autocast match torch.autocast and the exact sums of bf16 operands", "[amp][torch]") {
  require_torch();
  const auto dir = temp_dir("conv");
  const std::string f = (dir / "conv.safetensors").string();
  run_py(amp_script(), fmt::format("conv --seed 11 --out {}", f));
  const auto r = safetensors::load<Cpu>(f);
  namespace F = nn::functional;
  for (const std::string op : {"conv2d", "conv_transpose2d"}) {
    INFO(op);
    const bool tr = op == "conv_transpose2d";
    const auto in = [&](const char* n) { return r.at("in." + op + "." + n); };
    const T x = in("x"), w = in("w"), b = in("b"), gy = in("gy");
    const auto run = [&](const V& xv, const V& wv, const V& bv) {
      return tr ? F::conv_transpose2d(xv, wv, bv, 2, 1, 1, 2) : F::conv2d(xv, wv, bv, Size2{2, 1}, 1, Size2{1, 2}, 2);
    };
    // kiln under autocast: f32 leaves (the parameters' dtype), bf16 out, f32 gradients.
    V xv(x, true), wv(w, true), bv(b, true);
    V y;
    {
      autocast::Scope ac(DType::bf16);
      y = run(xv, wv, bv);
    }
    REQUIRE(y.dtype() == DType::bf16);
    (y.to(DType::f32) * V(gy)).sum().backward();
    REQUIRE(xv.grad().dtype() == DType::f32);
    REQUIRE(wv.grad().dtype() == DType::f32);
    REQUIRE(bv.grad().dtype() == DType::f32);

    // The exact sums of the bf16 operands (the incoming gradient rounded by the cast's backward), and
    // the sums of the terms' magnitudes: the same convolution of |operands| (every term positive).
    V x64(rounded(x), true), w64(rounded(w), true), b64(rounded(b), true);
    const V y64 = run(x64, w64, b64);
    y64.backward(rounded(gy));
    V xa(rounded(x).abs(), true), wa(rounded(w).abs(), true), ba(rounded(b).abs(), true);
    const V ya = run(xa, wa, ba);
    ya.backward(rounded(gy).abs());
    // Terms per value: forward (C_in/groups)·kh·kw (at most, transposed), dx (O/groups)·kh·kw, dw and db N·Ho·Wo (N·H·W).
    const int64_t taps = w.size(2) * w.size(3), kf = (tr ? w.size(0) / 2 : w.size(1)) * taps, kx = (tr ? w.size(1) : w.size(0) / 2) * taps;
    const int64_t kw = tr ? x.size(0) * x.size(2) * x.size(3) : y.size(0) * y.size(2) * y.size(3), kb = y.size(0) * y.size(2) * y.size(3);
    const std::vector<std::tuple<std::string, T, T, T, int64_t>> checks = {
        {"y", y.value(), y64.value(), ya.value(), kf},
        {"grad_x", xv.grad(), x64.grad(), xa.grad(), kx},
        {"grad_w", wv.grad(), w64.grad(), wa.grad(), kw},
        {"grad_b", bv.grad(), b64.grad(), ba.grad(), kb},
    };
    const bool native = item<double>(r.at("out." + op + ".native")) == 1;
    INFO("PyTorch side: " << (native ? "torch.autocast" : "by hand (bf16 operands, f32 compute, bf16 results)"));
    if (op == "conv2d" && !native) WARN("torch has no bf16 conv2d on this CPU: its autocast policy emulated by hand");
    for (const auto& [name, got, exact, abs_sum, K] : checks) {
      check_low(got, exact, abs_sum, K, "kiln " + op + " " + name);
      check_low(r.at("out." + op + "." + name), exact, abs_sum, K, "torch " + op + " " + name);
    }
  }
}

TEST_CASE("amp: a bf16 activation into an f32 Conv2d, ConvTranspose2d or Conv1d runs under autocast, and is an Error outside", "[amp]") {
  Generator g(9);
  nn::Conv2d<Cpu> conv({.in_channels = 3, .out_channels = 4, .kernel_size = 3, .padding = 1});
  nn::ConvTranspose2d<Cpu> convt({.in_channels = 4, .out_channels = 2, .kernel_size = 2, .stride = 2});
  nn::Conv1d<Cpu> conv1({.in_channels = 3, .out_channels = 2, .kernel_size = 3});
  const V x(T::randn({2, 3, 6, 5}, DType::f32, &g).to(DType::bf16));  // e.g. the output of an earlier low-precision op
  CHECK_THROWS_WITH(conv(x), Catch::Contains("conv2d") && Catch::Contains("bf16") && Catch::Contains("f32"));
  CHECK_THROWS_WITH(convt(V(T::randn({1, 4, 3, 3}, DType::f32, &g).to(DType::bf16))),
                    Catch::Contains("conv_transpose2d") && Catch::Contains("bf16") && Catch::Contains("f32"));
  V y, y1;
  {
    autocast::Scope ac(DType::bf16);
    y = convt(conv(x));
    y1 = conv1(V(T::randn({2, 3, 7}, DType::f32, &g).to(DType::bf16)));
  }
  REQUIRE(y.dtype() == DType::bf16);
  REQUIRE(y.shape() == Shape{2, 2, 12, 10});
  REQUIRE(y1.dtype() == DType::bf16);
  (y.to(DType::f32).sum() + y1.to(DType::f32).sum()).backward();
  for (const auto& [name, p] : conv.named_parameters()) CHECK(p.grad().dtype() == DType::f32);
  for (const auto& [name, p] : convt.named_parameters()) CHECK(p.grad().dtype() == DType::f32);
  for (const auto& [name, p] : conv1.named_parameters()) CHECK(p.grad().dtype() == DType::f32);
  // The bias's gradient is Σ dy over (N, H, W), exact in bf16 here: dy = 1 everywhere, 2·12·10 = 240 terms.
  CHECK(item<double>(convt.bias().grad().sub(240.0).abs().max()) == 0);
}

TEST_CASE("amp: fused attention under autocast takes bf16 q, k, v and rounds O once", "[amp]") {
  Generator g(5);
  const T q = T::randn({2, 3, 17, 16}, DType::f32, &g), k = T::randn({2, 3, 17, 16}, DType::f32, &g),
          v = T::randn({2, 3, 17, 16}, DType::f32, &g);
  V o;
  {
    autocast::Scope ac(DType::bf16);
    o = autograd::AttentionOps<Cpu>::attention(V(q), V(k), V(v), 0.25, true, 0);
  }
  REQUIRE(o.dtype() == DType::bf16);
  // The contract: bf16 inputs, f32 (here f64) compute, one rounding of O.
  const T qb = q.to(DType::bf16).to(DType::f64), kb = k.to(DType::bf16).to(DType::f64), vb = v.to(DType::bf16).to(DType::f64);
  const T o64 = autograd::AttentionOps<Cpu>::attention(V(qb), V(kb), V(vb), 0.25, true, 0).value();
  check_rel(o.value(), o64, 4 * kU, 1e-6, "attention");
}

TEST_CASE("amp: autocast f32 or disabled is bit-identical to no autocast, and the cast backward is exact", "[amp]") {
  const ModelConfig cfg = ModelConfig::from_json(json{{"vocab_size", 40},
                                                      {"d_model", 32},
                                                      {"n_layers", 2},
                                                      {"n_heads", 2},
                                                      {"max_seq_len", 16},
                                                      {"attention", "diff"},
                                                      {"residual", "attnres_block"},
                                                      {"attnres_block_size", 2},
                                                      {"tie_embeddings", true}})
                              .resolved();
  nn::GPT<Cpu> model(cfg);
  model.init_weights(1);
  Generator g(2);
  const T ids = T::uniform({2, 12}, 0, 40, DType::f32, &g).to(DType::i64), tgt = T::uniform({2, 12}, 0, 40, DType::f32, &g).to(DType::i64);
  auto run = [&](int mode) {
    model.zero_grad();
    V loss;
    {
      std::optional<autocast::Scope> ac;
      if (mode == 1) ac.emplace(DType::f32);
      if (mode == 2) ac.emplace(DType::bf16, false);
      if (mode == 3) ac.emplace(DType::bf16);
      loss = nn::cross_entropy(model.forward(ids).reshape({-1, 40}), tgt.reshape({-1}));
    }
    loss.backward();
    std::vector<T> out{loss.value()};
    for (auto& [n, p] : model.named_parameters()) out.push_back(p.grad().clone());
    return out;
  };
  const auto plain = run(0);
  for (int mode : {1, 2}) {
    const auto got = run(mode);
    for (size_t i = 0; i < plain.size(); ++i) kt::check_bits(got[i], plain[i], fmt::format("mode {} tensor {}", mode, i));
  }
  const auto low = run(3);  // really bf16: close, not equal, and every gradient f32
  CHECK(item<double>(low[0]) == Approx(item<double>(plain[0])).epsilon(0.01));
  for (size_t i = 1; i < low.size(); ++i) CHECK(low[i].dtype() == DType::f32);
  CHECK(item<double>(low[0]) != item<double>(plain[0]));

  // The cast's backward casts the gradient back, exactly; promotion sends each operand its share.
  const V x(T::randn({5, 7}, DType::f32, &g), true);
  const T gy = T::randn({5, 7}, DType::bf16, &g);
  x.to(DType::bf16).backward(gy);
  kt::check_bits(x.grad(), gy.to(DType::f32), "to(bf16) backward");
  const V a(T::randn({5, 7}, DType::bf16, &g), true), b(T::randn({7}, DType::f32, &g), true);
  const V y = a * b;  // bf16 * f32 -> f32 (PyTorch's promotion)
  REQUIRE(y.dtype() == DType::f32);
  const T gz = T::randn({5, 7}, DType::f32, &g);
  y.backward(gz);
  CHECK(a.grad().dtype() == DType::bf16);
  kt::check_bits(a.grad(), gz.mul(b.value()).to(DType::bf16), "promoted mul: grad of the bf16 operand");
  kt::check_bits(b.grad(), gz.mul(a.value().to(DType::f32)).sum({0}), "promoted mul: grad of the f32 operand");
}

TEST_CASE("amp: the policy table gives each op one policy and a name", "[amp]") {
  using autocast::Op, autocast::Policy;
  STATIC_REQUIRE(autocast::policy(Op::matmul) == Policy::low);
  STATIC_REQUIRE(autocast::policy(Op::linear) == Policy::low);
  STATIC_REQUIRE(autocast::policy(Op::attention) == Policy::low);
  STATIC_REQUIRE(autocast::policy(Op::softmax) == Policy::f32);
  STATIC_REQUIRE(autocast::policy(Op::rms_norm) == Policy::f32);
  STATIC_REQUIRE(autocast::policy(Op::binary) == Policy::promote);
  CHECK(std::string(autocast::name(Op::cross_entropy)) == "cross_entropy");
  Generator g(5);
  const V h(T::randn({3, 4}, DType::bf16, &g)), f(T::randn({3, 4}, DType::f32, &g));
  autocast::Scope ac(DType::bf16);
  CHECK(autocast::cast(Op::matmul, f).dtype() == DType::bf16);
  CHECK(autocast::cast(Op::softmax, h).dtype() == DType::f32);
  CHECK(autocast::cast(Op::binary, h).node() == h.node());  // promote: decided per pair, never a cast
  const V d(T::randn({3, 4}, DType::f64, &g));
  CHECK(autocast::cast(Op::linear, d).node() == d.node());  // f64 is never touched
}

TEST_CASE("amp: a Linear forward under bf16 autocast casts its weight once, x once and the bias once", "[amp]") {
  nn::Linear<Cpu> l(nn::LinearOptions{.in = 3, .out = 7, .bias = true});
  Generator g(4);
  const T x = T::randn({4, 3}, DType::f32, &g), x2 = T::randn({5, 3}, DType::f32, &g);
  V y, y2;
  {
    const profile::Session rec;
    autocast::Scope ac(DType::bf16);
    y = l.forward(V(x));
    y2 = l.forward(V(x2));  // the module called twice in one scope
  }
  // Each cast is one backend "to"; its operands are (output, input), so a weight cast reads
  // "[7, 3], [7, 3] bf16" (a cast of the transposed view would read [3, 7]).
  std::map<std::string, int> casts;
  for (const profile::Event& e : profile::events())
    if (e.name == "to") ++casts[e.shapes];
  CHECK(casts["[7, 3], [7, 3] bf16"] == 1);  // the weight: once per scope, however many forwards
  CHECK(casts["[7], [7] bf16"] == 1);        // the bias
  CHECK(casts["[4, 3], [4, 3] bf16"] == 1);  // each input once
  CHECK(casts["[5, 3], [5, 3] bf16"] == 1);
  int total = 0;
  for (const auto& [shapes, n] : casts) total += n;
  CHECK(total == 4);  // nothing else is cast in the forward (the output stays bf16)
  CHECK(y.dtype() == DType::bf16);
  CHECK(y2.dtype() == DType::bf16);
}

TEST_CASE("amp: a parameter is cast once per scope and its gradient sums every use", "[amp]") {
  nn::Linear<Cpu> l(nn::LinearOptions{.in = 8, .out = 8, .bias = false});
  const V w = l.named_parameters()[0].second;
  Generator g(3);
  const T x = T::randn({4, 8}, DType::f32, &g);
  V y, c1;
  {
    autocast::Scope ac(DType::bf16);
    c1 = autocast::to_low(w);
    CHECK(autocast::to_low(w).node() == c1.node());  // the cache
    y = l.forward(l.forward(V(x)));                  // w used twice
  }
  {
    autocast::Scope ac(DType::bf16);
    CHECK(autocast::to_low(w).node() != c1.node());  // a fresh scope casts afresh
  }
  y.to(DType::f32).sum().backward();
  // The same in explicit bf16 arithmetic, with two separate casts.
  const V wb(w.value().to(DType::bf16), true);
  const V h = V(x.to(DType::bf16)).matmul(wb.t());
  h.matmul(wb.t()).to(DType::f32).sum().backward();
  kt::check_bits(w.grad(), wb.grad().to(DType::f32), "grad of a twice-used parameter");
}

TEST_CASE("amp: one GPT training step under bf16 autocast matches torch.autocast(\"cpu\", bfloat16)", "[amp][torch]") {
  require_torch();
  // Tolerances. u = 2^-9 is bf16's unit roundoff. Both sides round to bf16 at (nearly) the same points
  // (the outputs of every matmul; torch also rounds q·kᵀ, the scaled scores and P inside attention,
  // and keeps softmax in bf16 on the CPU), and each rounding perturbs a value by <= u relative, in
  // practice independently: a path through n roundings ends about sqrt(n)·u off in relative L2.
  // Forward to the logits, per layer: the cast of the norm output, q/k/v, 3 in RoPE, O (torch: 3 more),
  // the out projection, gate/up, SiLU, the product, the down projection: about 12-16 → n ≈ 32 for two
  // layers plus the head; each side is then ~sqrt(32)·u ≈ 5.7u off the exact result and the two sides
  // differ by ~sqrt(2) of that ≈ 8u. Backward doubles the path (the bf16 products dy·Wᵀ and xᵀ·dy round
  // again): ~11u; gradients are sums with cancellation, so allow 2x: 24u. The loss, an f32 cross-entropy
  // over bf16 logits, averages the logit errors: 4u. (Measured: logits ~2u, gradients 3-5u vs f64 on
  // each side.) A second check compares accuracy: kiln's error against the float64 model must not
  // exceed 1.5x torch's plus u.
  struct Case {
    const char* name;
    json model;
  };
  const json base = {{"vocab_size", 61}, {"d_model", 64}, {"n_layers", 2}, {"n_heads", 4}, {"max_seq_len", 64}};
  json diff = base;
  diff["attention"] = "diff";
  diff["n_heads"] = 2;
  diff["residual"] = "attnres_block";
  diff["attnres_block_size"] = 2;
  diff["tie_embeddings"] = true;
  for (const Case& c : {Case{"mha, standard residual", base}, Case{"diff + attnres_block, tied (examples/char_gpt's kind)", diff}}) {
    SECTION(c.name) {
      const auto dir = temp_dir("step");
      const std::string m = (dir / "model.json").string(), init = (dir / "init.safetensors").string(),
                        tok = (dir / "tokens.safetensors").string(), out = (dir / "grads.safetensors").string();
      std::ofstream(m) << c.model.dump();
      const ModelConfig cfg = ModelConfig::from_json(c.model).resolved();
      const int64_t Bn = 4, Tn = 32;
      // --prepare: kiln_ref.py's init (seed 3) and tokens (3000, seed 1) in the same Python process
      run_py(amp_script(), fmt::format("grads --prepare --model {} --data {} --init-from {} --batch {} --seq-len {} --out {}", m, tok, init,
                                       Bn, Tn, out));

      nn::GPT<Cpu> model(cfg);
      model.load(init);
      const auto [x, y] = TokenData::load(tok).batch<Cpu>(0, Bn, Tn);
      V logits, loss;
      {
        autocast::Scope ac(DType::bf16);
        logits = model.forward(x);
        loss = nn::cross_entropy(logits.reshape({-1, cfg.vocab_size}), y.reshape({-1}));
      }
      loss.backward();
      CHECK(logits.dtype() == DType::bf16);
      CHECK(loss.dtype() == DType::f32);

      const auto r = safetensors::load<Cpu>(out);
      const T ref_loss = r.at("amp.loss").reshape({}), f64_loss = r.at("f64.loss").reshape({});
      CHECK(std::abs(item<double>(loss.value()) - item<double>(ref_loss)) <= 4 * kU * std::abs(item<double>(ref_loss)));
      const double lk = rel_l2(logits.value(), r.at("amp.logits"));
      INFO("logits: kiln vs torch " << lk << ", kiln vs f64 " << rel_l2(logits.value(), r.at("f64.logits")) << ", torch vs f64 "
                                    << rel_l2(r.at("amp.logits"), r.at("f64.logits")));
      WARN(c.name << ": logits kiln vs torch " << lk / kU << "u; vs float64: kiln " << rel_l2(logits.value(), r.at("f64.logits")) / kU
                  << "u, torch " << rel_l2(r.at("amp.logits"), r.at("f64.logits")) / kU << "u");
      CHECK(lk <= 8 * kU);
      CHECK(rel_l2(logits.value(), r.at("f64.logits")) <= 1.5 * rel_l2(r.at("amp.logits"), r.at("f64.logits")) + kU);
      for (const auto& [name, p] : model.named_parameters()) {
        const T want = r.at("amp.grad." + name), exact = r.at("f64.grad." + name);
        REQUIRE(p.grad().defined());
        CHECK(p.grad().dtype() == DType::f32);
        const double d = rel_l2(p.grad(), want), ek = rel_l2(p.grad(), exact), et = rel_l2(want, exact);
        INFO(name << ": kiln vs torch " << d << ", kiln vs f64 " << ek << ", torch vs f64 " << et);
        if (et <= 24 * kU) {
          CHECK(d <= 24 * kU);
          CHECK(ek <= 1.5 * et + kU);
        } else {
          // Ill-conditioned: PyTorch's own autocast misses float64 by more than the bound. So far only
          // differential attention's λ vectors: dλ sums o2·dO over every token and nearly cancels, so
          // the bf16 errors of the terms dominate the result (measured: torch 8-140% off float64). Both
          // sides then sit in the same noise: kiln must be no further than twice PyTorch's distance.
          CHECK(name.find("lambda_") != std::string::npos);
          CHECK(ek <= 2 * et);
        }
      }
    }
  }
}

TEST_CASE("amp: the loss scaler backs off on overflow and grows after good steps, and fit skips overflowing f16 steps", "[amp]") {
  autocast::GradScaler s({.init = 8, .growth = 2, .backoff = 0.5, .interval = 3});
  s.update(false);
  s.update(false);
  CHECK(s.scale() == 8);
  s.update(false);
  CHECK(s.scale() == 16);
  s.update(true);
  CHECK(s.scale() == 8);
  CHECK(s.good_steps() == 0);
  CHECK_THROWS_WITH(autocast::GradScaler({.init = 0}), Catch::Contains("GradScaler"));

  // fit with f16: a scale of 2^120 overflows f16 (and f32) gradients, so the first steps are skipped
  // (weights untouched) and the scale halves each time until the gradients fit.
  nn::Linear<Cpu> model(nn::LinearOptions{.in = 6, .out = 3, .bias = false});
  optim::Adam<Cpu> opt(model.named_parameters(), {.lr = 1e-2});
  Generator g(4);
  const T xs = T::randn({8, 6}, DType::f32, &g), ys = T::uniform({8}, 0, 3, DType::f32, &g).to(DType::i64);
  const T w0 = model.named_parameters()[0].second.value().clone();
  const auto dir = temp_dir("scaler");
  const std::string log = (dir / "log.jsonl").string();
  int64_t fetched = 0;
  IndexedBatches src{.batch = [&](int64_t i) { return (fetched = i); }};
  const FitResult res = fit(
      model, opt, src, [&](int64_t) { return nn::cross_entropy(model.forward(V(xs)), ys); },
      FitOptions{.steps = 200, .precision = DType::f16, .loss_scale = {.init = 0x1p120, .interval = 1000}, .log_path = log, .progress = 0});
  std::ifstream in(log);
  std::string line;
  std::vector<json> recs;
  while (std::getline(in, line)) recs.push_back(json::parse(line));
  REQUIRE(recs.size() == 200);
  CHECK(recs[0].value("overflow", false));
  CHECK(recs[0]["loss_scale"].get<double>() == 0x1p120);
  CHECK(recs[1]["loss_scale"].get<double>() == 0x1p119);
  int64_t first_good = -1;
  for (size_t i = 0; i < recs.size() && first_good < 0; ++i)
    if (!recs[i].value("overflow", false)) first_good = static_cast<int64_t>(i);
  REQUIRE(first_good > 0);
  CHECK(res.skipped == 0);  // overflows are not non-finite steps
  CHECK(recs.back()["loss"].get<double>() < recs[static_cast<size_t>(first_good)]["loss"].get<double>());
  CHECK(item<double>(model.named_parameters()[0].second.value().sub(w0).abs().max()) > 0);
}

namespace {

int sh(const std::string& cmd) {
  INFO(cmd);
  const int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// The records of the training steps (not the evaluation before training, "step": -1).
std::vector<json> read_log(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> recs;
  for (std::string line; std::getline(in, line);) {
    json r = json::parse(line);
    if (r["step"].get<int64_t>() >= 0) recs.push_back(std::move(r));
  }
  return recs;
}

}  // namespace

// f16 loss scaling tells an overflow from a divergence (train/loop.hpp, docs/mixed_precision.md): a
// non-finite loss comes from the forward, before any scaling, and goes to on_nonfinite at once; so do
// non-finite gradients once the scale is at its floor (min_scale, default 1). Neither moves the scale.
TEST_CASE("amp: under f16 loss scaling a diverged forward, or gradients not finite at the floor scale, reach on_nonfinite", "[amp]") {
  Generator g(6);
  const T xs = T::randn({8, 6}, DType::f32, &g), ys = T::uniform({8}, 0, 3, DType::f32, &g).to(DType::i64);
  const T nan_xs = xs.mul(std::nan(""));
  const auto dir = temp_dir("diverge");
  const std::string log = (dir / "log.jsonl").string();
  struct Run {
    FitResult res;
    std::vector<json> recs;
  };
  // kind "loss": the batch holds NaNs from step 3 on (the forward diverges); kind "grad": from step 0 the
  // loss is finite but one gradient is NaN at any scale (0·∞ in sqrt's backward at 0).
  const auto run = [&](const std::string& kind, NonFinite policy, double init) {
    nn::Linear<Cpu> model(nn::LinearOptions{.in = 6, .out = 3});
    optim::Adam<Cpu> opt(model.named_parameters(), {.lr = 1e-2});
    int64_t at = 0;
    IndexedBatches src{.batch = [&](int64_t i) { return (at = i); }};
    const auto step = [&](int64_t) {
      if (kind == "loss") return nn::cross_entropy(model.forward(V(at >= 3 ? nan_xs : xs)), ys);
      return nn::cross_entropy(model.forward(V(xs)), ys) + model.weight().mul(0.0).sqrt().sum();
    };
    Run out;
    out.res =
        fit(model, opt, src, step,
            FitOptions{
                .steps = 8, .on_nonfinite = policy, .precision = DType::f16, .loss_scale = {.init = init}, .log_path = log, .progress = 0});
    out.recs = read_log(log);
    return out;
  };

  // error: the first diverged step throws, naming it; before, every such step was an "overflow", skipped forever.
  CHECK_THROWS_WITH(run("loss", NonFinite::error, 1024), Catch::Contains("non-finite") && Catch::Contains("at step 3"));
  CHECK_THROWS_WITH(run("grad", NonFinite::error, 4), Catch::Contains("non-finite gradient at step 2") &&
                                                          Catch::Contains("at its floor min_scale 1") && Catch::Contains("'weight'"));

  // skip: counted as non-finite steps ("skipped", not "overflow"); the scale stays where it was.
  const Run a = run("loss", NonFinite::skip, 1024);
  REQUIRE(a.recs.size() == 8);
  CHECK(a.res.skipped == 5);
  for (size_t i = 0; i < 8; ++i) {
    INFO("step " << i << ": " << a.recs[i].dump());
    CHECK(a.recs[i].value("skipped", false) == (i >= 3));
    CHECK_FALSE(a.recs[i].value("overflow", false));
    CHECK(a.recs[i]["loss_scale"].get<double>() == 1024);
  }
  // Gradients that overflow at every scale: two backoffs (4 -> 2 -> 1), then divergences at the floor.
  const Run b = run("grad", NonFinite::skip, 4);
  REQUIRE(b.recs.size() == 8);
  CHECK(b.res.skipped == 6);
  const std::vector<double> scales{4, 2, 1, 1, 1, 1, 1, 1};
  for (size_t i = 0; i < 8; ++i) {
    INFO("step " << i << ": " << b.recs[i].dump());
    CHECK(b.recs[i].value("overflow", false) == (i < 2));
    CHECK(b.recs[i].value("skipped", false) == (i >= 2));
    CHECK(b.recs[i]["loss_scale"].get<double>() == scales[i]);
  }
  CHECK_THROWS_WITH(autocast::GradScaler({.min_scale = -1}), Catch::Contains("min_scale"));
}

TEST_CASE("amp: train::evaluate runs the forward under autocast to the precision it is given", "[amp]") {
  ModelConfig c;
  c.vocab_size = 32, c.d_model = 32, c.n_layers = 2, c.n_heads = 2, c.max_seq_len = 16;
  nn::GPT<Cpu> model(c.resolved());
  model.init_weights(3);
  std::vector<int64_t> toks;
  for (int64_t i = 0; i < 400; ++i) toks.push_back((i * 7 + i / 5) % 32);
  const TokenData data(toks);
  const double f32 = evaluate(model, data, 3, 4, 16), f32b = evaluate(model, data, 3, 4, 16, DType::f32);
  const double bf = evaluate(model, data, 3, 4, 16, DType::bf16);
  CHECK(f32 == f32b);
  CHECK(bf != f32);                                  // the products ran in bf16
  CHECK(std::abs(bf - f32) < 0.02 * std::abs(f32));  // and stayed within bf16's rounding of the loss
  CHECK_FALSE(autocast::enabled());                  // the scope ended with the call
}

TEST_CASE("amp: kiln train with \"precision\": \"bf16\" runs and the loss falls", "[amp][cli]") {
  const auto dir = temp_dir("cli");
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  std::ofstream(dir / "corpus.txt") << text;
  std::ofstream(dir / "model.json")
      << json{{"vocab_size", 32}, {"d_model", 32}, {"n_layers", 2}, {"n_heads", 2}, {"max_seq_len", 32}}.dump();
  std::ofstream(dir / "train.json") << json{
      {"batch_size", 8},
      {"seq_len", 32},
      {"steps", 30},
      {"precision", "bf16"},
      {"optimizer",
       {{"name", "adamw"}, {"lr", 1e-2}}}}.dump();
  const std::string d = dir.string();
  REQUIRE(sh(fmt::format("{} tokenize --text {}/corpus.txt --chars --out {}/tok.safetensors >/dev/null", KILN_CLI, d, d)) == 0);
  REQUIRE(sh(fmt::format("{} train --model {}/model.json --train {}/train.json --data {}/tok.safetensors --log {}/log.jsonl "
                         "--progress off > {}/out.txt 2>&1",
                         KILN_CLI, d, d, d, d, d, d)) == 0);
  std::ifstream out(dir / "out.txt");
  const std::string printed((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
  CHECK_THAT(printed, Catch::Contains("precision bf16 (autocast)"));
  const auto recs = read_log(d + "/log.jsonl");
  REQUIRE(recs.size() == 30);
  const double first = recs.front()["loss"].get<double>(), last = recs.back()["loss"].get<double>();
  INFO("loss " << first << " -> " << last);
  CHECK(last < 0.5 * first);
  // A bad value names the key and the valid ones.
  std::ofstream(dir / "bad.json") << json{{"precision", "fp8"}}.dump();
  CHECK(sh(fmt::format("{} train --train {}/bad.json --data {}/tok.safetensors --model {}/model.json > {}/bad.txt 2>&1", KILN_CLI, d, d, d,
                       d)) != 0);
  std::ifstream bad(dir / "bad.txt");
  const std::string msg((std::istreambuf_iterator<char>(bad)), std::istreambuf_iterator<char>());
  CHECK_THAT(msg, Catch::Contains("precision") && Catch::Contains("bf16"));
}

// examples/char_gpt (diff attention + attnres_block) on Debian's fortunes (scripts/train_demo.sh's
// corpus and tokenizer), 300 steps in f32 and in bf16: the final held-out losses within 2%, as the
// mean over seeds 0, 1, 2. One seed is not enough: at 300 steps the final loss moves by 1-3% with the
// seed, or with any change in the order of a few additions, in f32 alone, and PyTorch's own bf16 run
// ends up to 4% from its f32 run from the same weights (bench/amp/bf16_gap.py; docs/mixed_precision.md).
// Measured on 2026-11-26 (branch h-debts, on b5d481b; examples/char_gpt/train.json as abad0fa left it:
// batch 16 x 128, warmup 160, cosine to 5% over the 300 steps, shuffled windows), AMD EPYC with AVX-512
// BF16: f32 2.0232 / 2.0358 / 2.0321, bf16 2.0124 / 2.0467 / 2.0387, means 2.0304 and 2.0326 (+0.11%).
// (At 0a6ee40, with that file's warmup 50, cosine to 10% and consecutive windows: means 2.3219 and 2.3454.)
// About 6 x 75 s on 2 cores shared with other builds (load average 10).
TEST_CASE("amp: examples/char_gpt trained 300 steps in bf16 ends within 2% of f32 held-out loss", "[amp][slow]") {
  if (!std::filesystem::exists("/usr/share/games/fortunes/fortunes"))
    FAIL("Debian's fortunes package is missing (apt-get install fortunes; scripts/train_demo.sh installs it)");
  const auto dir = temp_dir("char_gpt");
  const std::string d = dir.string(), src = KILN_SOURCE_DIR;
  REQUIRE(sh(fmt::format("find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' -print0 | sort -z | "
                         "xargs -0 cat | sed 's/^%$//' | LC_ALL=C tr -cd '\\11\\12\\40-\\176' > {}/corpus.txt",
                         d)) == 0);
  REQUIRE(sh(fmt::format("{} tokenize --text {}/corpus.txt --chars --out {}/train.safetensors --eval-out {}/eval.safetensors "
                         "--eval-fraction 0.05 >/dev/null",
                         KILN_CLI, d, d, d, d)) == 0);
  json t;
  std::ifstream(src + "/examples/char_gpt/train.json") >> t;
  t["steps"] = 300;
  t["time_limit_s"] = 0;               // 300 steps whatever the machine's load
  std::map<std::string, double> eval;  // the mean over the seeds
  std::string each;
  constexpr int kSeeds = 3;
  for (int seed = 0; seed < kSeeds; ++seed)
    for (const char* prec : {"f32", "bf16"}) {
      t["precision"] = prec;
      const std::string tj = fmt::format("{}/train_{}.json", d, prec), log = fmt::format("{}/log_{}_{}.jsonl", d, prec, seed);
      std::ofstream(tj) << t.dump();
      REQUIRE(sh(fmt::format("{} train --model {}/examples/char_gpt/model.json --train {} --data {}/train.safetensors "
                             "--eval-data {}/eval.safetensors --seed {} --log {} --quiet",
                             KILN_CLI, src, tj, d, d, seed, log)) == 0);
      const auto recs = read_log(log);
      REQUIRE(recs.size() == 300);
      REQUIRE(recs.back().contains("eval_loss"));
      const double e = recs.back()["eval_loss"].get<double>();
      eval[prec] += e / kSeeds;
      each += fmt::format("{}seed {} {} {:.4f}", each.empty() ? "" : ", ", seed, prec, e);
    }
  INFO("held-out loss, mean of " << kSeeds << " seeds: f32 " << eval["f32"] << ", bf16 " << eval["bf16"] << " (" << each << ")");
  WARN("char_gpt 300 steps, held-out loss, mean of " << kSeeds << " seeds: f32 " << eval["f32"] << ", bf16 " << eval["bf16"] << " (" << each
                                                     << ")");
  CHECK(std::abs(eval["bf16"] - eval["f32"]) <= 0.02 * eval["f32"]);
}

#if defined(KILN_HAVE_CUDA_BACKEND)
// Cuda: autocast sends the matmuls to cuBLAS on 16-bit operands with f32 compute (tensor cores on a
// GPU), attention to the f32 flash kernels. The bf16 step rounds where the Cpu's does, so the two agree
// within the bounds of the torch comparison above (only accumulation orders differ); the f16 step
// (u = 2^-11) lies within the same bounds of the Cpu's f32 step. Then kiln::fit with precision f16: the
// loss scale backs off from an overflowing 2^100 and training proceeds.
TEST_CASE("amp: on Cuda, bf16 and f16 autocast steps agree with the Cpu, and f16 fit with loss scaling trains", "[amp][cuda]") {
  const ModelConfig cfg =
      ModelConfig::from_json(json{{"vocab_size", 40}, {"d_model", 32}, {"n_layers", 2}, {"n_heads", 2}, {"max_seq_len", 16}}).resolved();
  nn::GPT<Cpu> cpu(cfg);
  cpu.init_weights(1);
  const auto dir = temp_dir("cuda");
  const std::string w = (dir / "w.safetensors").string();
  cpu.save(w);
  nn::GPT<Cuda> gpu(cfg);
  gpu.load(w);
  Generator g(2);
  const T ids = T::uniform({2, 12}, 0, 40, DType::f32, &g).to(DType::i64), tgt = T::uniform({2, 12}, 0, 40, DType::f32, &g).to(DType::i64);
  const auto step = [&]<Backend B>(nn::GPT<B>& m, DType prec) {
    m.zero_grad();
    const Tensor<B> x = Tensor<B>::from_blob(ids.contiguous().to_vector<int64_t>().data(), ids.shape(), DType::i64),
                    y = Tensor<B>::from_blob(tgt.contiguous().to_vector<int64_t>().data(), tgt.shape(), DType::i64);
    Var<B> logits, loss;
    {
      autocast::Scope ac(prec);
      logits = m.forward(x);
      loss = nn::cross_entropy(logits.reshape({-1, 40}), y.reshape({-1}));
    }
    loss.backward();
    std::vector<T> out{T::from_vector(logits.value().template to_vector<float>(), logits.shape()),
                       T::from_vector(loss.value().reshape({1}).template to_vector<float>(), {1})};
    CHECK(logits.dtype() == (prec == DType::f32 ? DType::f32 : prec));
    for (auto& [n, p] : m.named_parameters()) {
      CHECK(p.grad().dtype() == DType::f32);
      out.push_back(T::from_vector(p.grad().template to_vector<float>(), p.shape()));
    }
    return out;
  };
  const auto cpu_bf16 = step(cpu, DType::bf16), cpu_f32 = step(cpu, DType::f32);
  const auto gpu_bf16 = step(gpu, DType::bf16), gpu_f16 = step(gpu, DType::f16);
  for (size_t i = 0; i < cpu_bf16.size(); ++i) {
    INFO("tensor " << i << " (0 logits, 1 loss, then the gradients in named_parameters order)");
    const double tol = i == 0 ? 8 * kU : 24 * kU;
    CHECK(rel_l2(gpu_bf16[i], cpu_bf16[i]) <= tol);
    CHECK(rel_l2(gpu_f16[i], cpu_f32[i]) <= tol);
  }

  optim::Adam<Cuda> opt(gpu.named_parameters(), {.lr = 1e-2});
  const Tensor<Cuda> x = Tensor<Cuda>::from_blob(ids.contiguous().to_vector<int64_t>().data(), ids.shape(), DType::i64),
                     y = Tensor<Cuda>::from_blob(tgt.contiguous().to_vector<int64_t>().data(), tgt.shape(), DType::i64);
  const std::string log = (dir / "log.jsonl").string();
  IndexedBatches src{.batch = [](int64_t i) { return i; }};
  fit(
      gpu, opt, src,
      [&](int64_t) {
        return nn::cross_entropy(gpu.forward(x).reshape({-1, 40}), y.reshape({-1}));
      },
      FitOptions{.steps = 120, .precision = DType::f16, .loss_scale = {.init = 0x1p100}, .log_path = log, .progress = 0});
  const auto recs = read_log(log);
  REQUIRE(recs.size() == 120);
  CHECK(recs[0].value("overflow", false));
  int64_t first_good = -1;
  for (size_t i = 0; i < recs.size() && first_good < 0; ++i)
    if (!recs[i].value("overflow", false)) first_good = static_cast<int64_t>(i);
  REQUIRE(first_good > 0);
  REQUIRE(first_good < 110);
  CHECK(recs.back()["loss"].get<double>() < 0.8 * recs[static_cast<size_t>(first_good)]["loss"].get<double>());
}
#endif
