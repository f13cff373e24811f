// Fused attention (core/fused.hpp attention_forward/backward, the Cpu flash kernel, the autograd op,
// nn::attention) against the decomposed oracle nn::attention_decomposed (scores, softmax, matmul
// through autograd ops), on Reference (composite default), Cpu (flash kernel) and Cuda (tensor-core and
// FMA flash kernels).
//
// Tolerances. f64 runs compare fused f64 with decomposed f64; f32 runs compare fused f32 with the
// decomposed path evaluated in f64 on the same (f32-representable) inputs, so the whole difference is
// the f32 kernel's roundoff. Both use one bound, derived from Higham's summation bound: every output
// element is a chain of sums whose lengths add up to at most n = d + dv + S + rep·T (scores: length d;
// softmax denominator and P·V: S; dP: dv; dK/dV accumulate over the rep·T queries of a group), plus a
// few roundings per element (exp to ~8 ulp, scale, division): so |err| <= (n + 32) u · (1 + max|s|) · M,
// with u the unit roundoff of the compute type, max|s| the largest score magnitude (the relative error
// of exp(s) grows with |s|), and M the largest magnitude of that output in the oracle (a bound on the
// partial sums, which are convex combinations or sums of same-signed terms of that size, times n).
// This is the worst-case form, not a fitted one: f64 gives ~1e-13·M, f32 ~1e-4·M at these sizes.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <kiln/autograd/gradcheck.hpp>
#include <kiln/backends/backends.hpp>
#include <kiln/core/fused.hpp>
#include <kiln/core/fused_diff_attention.hpp>
#include <kiln/nn/attention.hpp>
#include <kiln/nn/diff_attention.hpp>
#include <kiln/nn/norm.hpp>
#include "common/kiln_test.hpp"

using namespace kiln;

namespace {

struct Case {
  int64_t B, H, Hkv, T, S, d, dv;
  bool causal;
  int64_t pos0;
  bool padding = false;   // random key padding (every row keeps a visible key)
  int layout = 0;         // 0 contiguous, 1 q/k/v transposed views [B, T, H, d], 2 sliced cache + strided last dim,
                          // 3 rows at an odd element offset (not 16-byte aligned)
  std::string mask{};     // the attention mask's shape (kMaskShapes), "" for none
  bool additive = false;  // additive float mask (with −inf entries) rather than bool
  double softcap = 0;     // Gemma 2's soft cap on the scores (0: none)
  std::string str() const {
    return fmt::format("B={} H={} Hkv={} T={} S={} d={} dv={} causal={} pos0={} padding={} layout={} mask={} additive={} softcap={}", B, H,
                       Hkv, T, S, d, dv, causal, pos0, padding, layout, mask, additive, softcap);
  }
};

// c with an attention mask of shape m (kMaskShapes), bool or additive.
Case with_mask(Case c, std::string m, bool additive) {
  c.mask = std::move(m);
  c.additive = additive;
  return c;
}

// Mask shapes, each broadcast to [B, H, T, S]: "TS^T" is a transposed (non-contiguous) view of an
// [S, T] tensor, "T1" broadcasts along the keys (zero stride in the kernels' innermost loop).
const std::vector<std::string> kMaskShapes{"TS", "S", "B1TS", "1HTS", "BHTS", "B11S", "11TS", "TS^T", "T1", "B1T1"};

const std::vector<Case> kCases = {
    {2, 4, 4, 37, 37, 16, 16, true, 0},
    {2, 4, 2, 37, 53, 16, 16, true, 16},             // KV-cache decoding chunk: T != S, pos0 = S - T, GQA 2
    {1, 4, 1, 5, 53, 8, 8, true, 48},                // GQA 4
    {1, 1, 1, 1, 70, 16, 16, true, 69},              // one decoded token, H = Hkv = 1
    {2, 2, 2, 37, 53, 8, 16, false, 0},              // d != dv, no mask
    {1, 2, 1, 130, 130, 32, 24, true, 0},            // several tiles with ragged ends
    {1, 1, 1, 150, 200, 16, 8, true, 50},            // one (batch, kv head) unit: private dQ buffers
    {1, 2, 1, 150, 150, 16, 16, true, 0, false, 1},  // ... summed into dq laid out like transposed q
    {2, 2, 1, 20, 20, 8, 8, true, 5},                // pos0 > 0 with T = S: a partly visible diagonal
    {2, 4, 2, 37, 53, 16, 16, true, 16, true},       // key padding
    {2, 4, 2, 33, 45, 8, 12, false, 0, true},        // key padding without causal
    {2, 4, 2, 37, 53, 16, 16, true, 16, false, 1},
    {2, 4, 2, 37, 53, 16, 8, false, 0, true, 2},
};

// The mask cases: every shape, bool and additive, alone and with causal (KV-cache offset) and key
// padding, T != S, GQA, ragged tiles.
std::vector<Case> mask_cases() {
  std::vector<Case> out;
  int i = 0;
  for (const std::string& m : kMaskShapes)
    for (bool additive : {false, true}) {
      const int k = i++ % 3;
      Case c = k == 0   ? Case{2, 4, 2, 37, 53, 16, 12, true, 16, true}
               : k == 1 ? Case{2, 2, 1, 70, 33, 8, 8, false, 0, false, 1}
                        : Case{1, 3, 3, 9, 9, 4, 6, true, 0, true};
      c.mask = m;
      c.additive = additive;
      out.push_back(c);
    }
  return out;
}

template <Backend B> struct Inputs { Tensor<B> q{}, k{}, v{}, kp{}, dout{}, mask{}; };

// Random inputs in dtype dt with the case's layout; values are f32-representable (drawn in f32).
template <Backend B> Inputs<B> make_inputs(const Case& c, DType dt, uint64_t seed) {
  Generator gen(seed);
  auto rnd = [&](Shape s) { return Tensor<B>::randn(s, DType::f32, &gen).to(dt); };
  Inputs<B> in;
  if (c.layout == 0) {
    in.q = rnd({c.B, c.H, c.T, c.d});
    in.k = rnd({c.B, c.Hkv, c.S, c.d});
    in.v = rnd({c.B, c.Hkv, c.S, c.dv});
  } else if (c.layout == 1) {  // heads interleaved, as after a projection: [B, T, H, d] transposed
    in.q = rnd({c.B, c.T, c.H, c.d}).transpose(1, 2);
    in.k = rnd({c.B, c.S, c.Hkv, c.d}).transpose(1, 2);
    in.v = rnd({c.B, c.S, c.Hkv, c.dv}).transpose(1, 2);
  } else if (c.layout == 3) {  // rows one element into a wider buffer: unit stride, rows not 16-byte aligned
    in.q = rnd({c.B, c.H, c.T, c.d + 1}).narrow(3, 1, c.d);
    in.k = rnd({c.B, c.Hkv, c.S, c.d + 1}).narrow(3, 1, c.d);
    in.v = rnd({c.B, c.Hkv, c.S, c.dv + 1}).narrow(3, 1, c.dv);
  } else {  // a sliced KV cache, a stepped q, a v with stride 2 in the last dim
    in.q = rnd({c.B, c.H, c.T + 3, c.d}).narrow(2, 3, c.T);
    in.k = rnd({c.B, c.Hkv, c.S + 10, c.d}).narrow(2, 0, c.S);
    in.v = rnd({c.B, c.Hkv, c.S, 2 * c.dv}).slice(3, 1, 2 * c.dv, 2);
  }
  in.dout = rnd({c.B, c.H, c.T, c.dv});
  if (c.padding) {
    // pad out about a third of the keys, but never key 0 (visible to every causal row)
    const Tensor<B> r = Tensor<B>::rand({c.B, c.S}, DType::f32, &gen);
    Tensor<B> keep = r.gt(0.33);
    keep.narrow(1, 0, 1).fill_(1);
    in.kp = keep;
  }
  if (!c.mask.empty()) {
    // key 0 stays visible (so no row is left without a key); a mask broadcast along the keys only
    // shifts rows (additive) or is all true (bool)
    const std::string& m = c.mask;
    Shape s = m == "TS"     ? Shape{c.T, c.S}
              : m == "S"    ? Shape{c.S}
              : m == "B1TS" ? Shape{c.B, 1, c.T, c.S}
              : m == "1HTS" ? Shape{1, c.H, c.T, c.S}
              : m == "BHTS" ? Shape{c.B, c.H, c.T, c.S}
              : m == "B11S" ? Shape{c.B, 1, 1, c.S}
              : m == "11TS" ? Shape{1, 1, c.T, c.S}
              : m == "TS^T" ? Shape{c.S, c.T}
              : m == "T1"   ? Shape{c.T, 1}
                            : Shape{c.B, 1, c.T, 1};
    const bool along_keys = m == "T1" || m == "B1T1";
    const int key_axis = m == "TS^T" ? 0 : static_cast<int>(s.size()) - 1;
    const Tensor<B> u = Tensor<B>::rand(s, DType::f32, &gen);
    Tensor<B> keep = along_keys ? Tensor<B>::ones(s, DType::boolean) : u.gt(0.25);
    keep.narrow(key_axis, 0, 1).fill_(1);
    if (c.additive) {
      const Tensor<B> a = Tensor<B>::randn(s, DType::f32, &gen).to(dt);
      in.mask = Tensor<B>::where(keep, a, Tensor<B>::full({}, -INFINITY, dt));
    } else {
      in.mask = keep;
    }
    if (m == "TS^T") in.mask = in.mask.transpose(0, 1);
  }
  return in;
}

double max_abs(const std::vector<double>& x) {
  double m = 0;
  for (double a : x)
    if (std::isfinite(a)) m = std::max(m, std::abs(a));
  return m;
}

// The bound described at the top of the file.
kt::Tol bound(const Case& c, DType compute, double max_score, double magnitude) {
  const double n = static_cast<double>(c.d + c.dv + c.S + (c.H / c.Hkv) * c.T + 32);
  return {0.0, n * kt::u_acc(compute) * (1 + max_score) * magnitude};
}

template <Backend B> double max_score(const Inputs<B>& in, const Case& c) {
  // |s_ij| <= scale ‖q_i‖ ‖k_j‖
  auto row_norm_max = [](const Tensor<B>& x) {
    const Tensor<B> x64 = x.to(DType::f64);
    return std::sqrt(max_abs(kt::host(x64.mul(x64).sum({-1}))));
  };
  double m = row_norm_max(in.q) * row_norm_max(in.k) / std::sqrt(static_cast<double>(c.d));
  if (c.softcap > 0) m = std::min(m, c.softcap);  // |cap · tanh(s / cap)| < cap
  if (in.mask.defined() && in.mask.dtype() != DType::boolean) m += max_abs(kt::host(in.mask.to(DType::f64)));  // scores + mask
  return m;
}

struct Result {
  std::vector<double> o, dq, dk, dv;
};

// Runs nn::attention (fused) or nn::attention_decomposed on the inputs, converted to dtype dt.
template <Backend B> Result run(const Inputs<B>& in, const Case& c, DType dt, bool fused) {
  Var<B> q(in.q.to(dt), true), k(in.k.to(dt), true), v(in.v.to(dt), true);
  const Tensor<B> mask = in.mask.defined() && in.mask.dtype() != DType::boolean ? in.mask.to(dt) : in.mask;
  const Var<B> o = fused ? nn::attention(q, k, v, c.causal, c.pos0, in.kp, mask, c.softcap)
                         : nn::attention_decomposed(q, k, v, c.causal, c.pos0, in.kp, mask, c.softcap);
  if (fused) CHECK(std::string(o.grad_fn()) == "attention");
  o.backward(in.dout.to(dt));
  return {kt::host(o.value()), kt::host(q.grad()), kt::host(k.grad()), kt::host(v.grad())};
}

// got against want within tol, and per element `extra` more where it is given.
void compare(const std::vector<double>& got, const std::vector<double>& want, kt::Tol tol, const std::string& what,
             const std::vector<double>& extra = {}) {
  INFO(what);
  REQUIRE(got.size() == want.size());
  REQUIRE((extra.empty() || extra.size() == want.size()));
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double a = got[i], b = want[i], e = extra.empty() ? 0.0 : extra[i];
    const bool ok =
        std::isnan(b) ? std::isnan(a) : a == b || std::abs(a - b) <= tol.atol + e + tol.rtol * std::abs(b);  // (a == b: infinities)
    if (!ok && bad++ == 0) first = static_cast<int64_t>(i);
  }
  INFO("tolerance " << tol.atol << "; mismatches " << bad
                    << (first >= 0 ? fmt::format(" first at {}: got {} want {}", first, got[static_cast<size_t>(first)],
                                                 want[static_cast<size_t>(first)])
                                   : std::string()));
  CHECK(bad == 0);
}

template <Backend B> void check_case(const Case& c, DType dt, uint64_t seed) {
  INFO(c.str() << " dtype " << dtype_name(dt));
  const Inputs<B> in = make_inputs<B>(c, dt, seed);
  const Result got = run(in, c, dt, true);
  const Result want = run(in, c, DType::f64, false);  // the oracle in f64 on the same inputs
  const double ms = max_score(in, c);
  compare(got.o, want.o, bound(c, dt, ms, max_abs(want.o)), "O");
  compare(got.dq, want.dq, bound(c, dt, ms, max_abs(want.dq)), "dq");
  compare(got.dk, want.dk, bound(c, dt, ms, max_abs(want.dk)), "dk");
  compare(got.dv, want.dv, bound(c, dt, ms, max_abs(want.dv)), "dv");
}

// f32 cases on each of a backend's f32 kernels: on Cuda the tensor-core kernels (taken where the head
// dims fit) and the FMA kernels.
template <Backend B> void check_f32_cases(const std::vector<Case>& cases, uint64_t seed) {
#if defined(KILN_HAVE_CUDA_BACKEND)
  if constexpr (std::is_same_v<B, Cuda>) {
    struct Restore {
      ~Restore() { cuda::set_attention_tensor_cores(true); }
    } restore;
    for (const bool tc : {true, false}) {
      INFO((tc ? "Cuda: tensor-core kernels where the head dims fit" : "Cuda: FMA kernels"));
      cuda::set_attention_tensor_cores(tc);
      uint64_t s = seed;
      for (const Case& c : cases) check_case<B>(c, DType::f32, s++);
    }
    return;
  }
#endif
  for (const Case& c : cases) check_case<B>(c, DType::f32, seed++);
}

// Whether backend B's bf16/f16 forward rounds P to the inputs' dtype before P·V (Cuda's half products on
// the tensor cores, cuda::set_attention_half_products) rather than computing as the f32 widening would.
template <Backend B> bool rounds_p() {
#if defined(KILN_HAVE_CUDA_BACKEND)
  if constexpr (std::is_same_v<B, Cuda>) return cuda::attention_half_products();
#endif
  return false;
}

// The bf16/f16 forward's O against the f64 oracle `want` (O's values), the inputs of dtype dt: f32
// roundoff (bound) and the output's rounding to dt (2 u_store, relative), and where B rounds P to dt,
// u_store(dt) · max|v| more: each P_ij is then off by at most u P_ij, so O's row i by at most
// u Σ_j P_ij |v_j| / l_i <= u max|v|.
template <Backend B> kt::Tol half_forward_tol(const Case& c, const Inputs<B>& in, DType dt, const std::vector<double>& want) {
  double atol = bound(c, DType::f32, max_score(in, c), max_abs(want)).atol;
  if (rounds_p<B>()) atol += kt::u_store(dt) * max_abs(kt::host(in.v.to(DType::f64)));
  return {2 * kt::u_store(dt), atol};
}

// Runs f with Cuda's half products off (the exact path for half inputs), restoring them after.
template <Backend B, class F> void exact_half_path(F&& f) {
#if defined(KILN_HAVE_CUDA_BACKEND)
  if constexpr (std::is_same_v<B, Cuda>) {
    struct Restore {
      ~Restore() { cuda::set_attention_half_products(true); }
    } restore;
    cuda::set_attention_half_products(false);
    f();
    return;
  }
#endif
  f();
}

// Runs f with Cuda's half forward and dQ pass at 128 query rows per block (cuda::set_attention_query_rows),
// restoring the default after; on other backends, not at all.
template <Backend B, class F> void at_128_query_rows([[maybe_unused]] F&& f) {
#if defined(KILN_HAVE_CUDA_BACKEND)
  if constexpr (std::is_same_v<B, Cuda>) {
    struct Restore {
      ~Restore() { cuda::set_attention_query_rows(0); }
    } restore;
    cuda::set_attention_query_rows(128);
    f();
  }
#endif
}

// a and b hold the same values (NaN where the other has NaN; −0 and +0 alike).
void same_values(const std::vector<double>& a, const std::vector<double>& b, const char* what) {
  REQUIRE(a.size() == b.size());
  int64_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += !(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])));
  INFO(what);
  CHECK(bad == 0);
}

}  // namespace

TEMPLATE_TEST_CASE("attention: fused forward and backward match the decomposed oracle (f64)", "[attention]", KILN_BACKEND_TYPES) {
  uint64_t seed = 100;
  for (const Case& c : kCases) check_case<TestType>(c, DType::f64, seed++);
}

TEMPLATE_TEST_CASE("attention: fused forward and backward match the decomposed oracle (f32 vs f64 oracle)", "[attention]",
                   KILN_BACKEND_TYPES) {
  check_f32_cases<TestType>(kCases, 200);
}

// ---- the Cpu kernel's own f32 tile products (backends/cpu/attention.cpp, "tile products"): the edges
// of their register blocks. Head dims 32, 64, 80 (AVX-512: 4 + 1 vectors; AVX2: 2 blocks of 16, then
// 16), 128 (two column blocks) and odd dv (a masked last vector); T odd and not a multiple of the 64-row
// tile (row blocks of 6 or 8, then 4, 2, 1); causal diagonal blocks (every key count 1..64, so every
// tail mask); GQA; q/k/v as strided views (heads interleaved, a sliced cache). Run at the best ISA here,
// at AVX2 by the isa-avx2 entry (tests/CMakeLists.txt) and at baseline (OpenBLAS) by isa-baseline.
const std::vector<Case> kTileCases = {
    {1, 2, 2, 67, 67, 32, 32, true, 0},
    {1, 4, 2, 131, 131, 64, 64, true, 0},             // GQA 2, T = 2 · 64 + 3
    {2, 2, 2, 77, 77, 80, 80, false, 0, false, 1},    // heads interleaved: row stride H · d
    {1, 2, 2, 70, 83, 128, 128, true, 13, false, 2},  // a sliced cache, a stepped q
    {1, 4, 2, 45, 109, 80, 47, true, 64},             // KV-cache chunk, d != dv, odd dv
    {1, 1, 1, 193, 193, 64, 64, false, 0, true},      // three full tiles + 1 row, key padding
    {1, 2, 1, 29, 29, 128, 40, true, 0, false, 1},
    {1, 2, 1, 70, 70, 32, 48, true, 0, true, 3},  // rows not 16-byte aligned (Cuda: scalar tile loads)
};

TEMPLATE_TEST_CASE("attention: the f32 tile products at the edges of their register blocks (f32 vs f64 oracle)", "[attention][tile]", Cpu) {
  uint64_t seed = 900;
  for (const Case& c : kTileCases) check_case<TestType>(c, DType::f32, seed++);
}

#if defined(KILN_HAVE_CUDA_BACKEND)
// The same cases on Cuda's f32 kernels: the tensor-core tiles (64 rows, 4 warps of 16, 8-column mma
// pieces) at their edges too, head dims 32 to 128, and the FMA kernels where dv = 47. Not tagged [tile]:
// that tag selects the Cpu kernel's AVX2 run (isa-avx2 entries, tests/CMakeLists.txt), which has no skip
// code for a missing GPU.
TEST_CASE("attention: Cuda's f32 tile products at the edges of their tiles (f32 vs f64 oracle)", "[attention]") {
  check_f32_cases<Cuda>(kTileCases, 950);
}
#endif

TEMPLATE_TEST_CASE("attention: masks (bool, additive, every broadcast shape) match the decomposed oracle (f64)", "[attention][mask]",
                   KILN_BACKEND_TYPES) {
  uint64_t seed = 400;
  for (const Case& c : mask_cases()) check_case<TestType>(c, DType::f64, seed++);
}

TEMPLATE_TEST_CASE("attention: masks match the decomposed oracle (f32 vs f64 oracle)", "[attention][mask]", KILN_BACKEND_TYPES) {
  check_f32_cases<TestType>(mask_cases(), 500);
}

TEMPLATE_TEST_CASE("attention: f32 fused equals the f32 decomposed path within the same bound", "[attention]", KILN_BACKEND_TYPES) {
  // (both sides f32: the bound covers the roundoff of each, so it is doubled)
  uint64_t seed = 300;
  for (const Case& c : {kCases[1], kCases[5], kCases[8]}) {
    INFO(c.str());
    const Inputs<TestType> in = make_inputs<TestType>(c, DType::f32, seed++);
    const Result got = run(in, c, DType::f32, true), want = run(in, c, DType::f32, false);
    const double ms = max_score(in, c);
    auto tol = [&](const std::vector<double>& w) { return kt::Tol{0.0, 2 * bound(c, DType::f32, ms, max_abs(w)).atol}; };
    compare(got.o, want.o, tol(want.o), "O");
    compare(got.dq, want.dq, tol(want.dq), "dq");
    compare(got.dk, want.dk, tol(want.dk), "dk");
    compare(got.dv, want.dv, tol(want.dv), "dv");
  }
}

TEMPLATE_TEST_CASE("attention: bf16 and f16 outputs keep their dtype (LSE f32) within the f64 oracle's bound", "[attention]",
                   KILN_BACKEND_TYPES) {
  const Case c{2, 4, 2, 37, 53, 16, 16, true, 16};
  for (DType dt : {DType::bf16, DType::f16}) {
    INFO(dtype_name(dt));
    const Inputs<TestType> in = make_inputs<TestType>(c, dt, 7);
    auto [o, lse] = fused::attention_forward(in.q, in.k, in.v, 0.25, c.causal, c.pos0);
    CHECK(o.dtype() == dt);
    CHECK(lse.dtype() == DType::f32);
    auto [o64, lse64] =
        fused::attention_forward_composite(in.q.to(DType::f64), in.k.to(DType::f64), in.v.to(DType::f64), 0.25, c.causal, c.pos0);
    const std::vector<double> want = kt::host(o64);
    compare(kt::host(o), want, half_forward_tol(c, in, dt, want), "O");
    compare(kt::host(lse), kt::host(lse64), {0.0, bound(c, DType::f32, max_score(in, c), 1.0).atol * 8}, "LSE");
    auto [dq, dk, dv] = fused::attention_backward(in.q, in.k, in.v, o, lse, in.dout, 0.25, c.causal, c.pos0);
    CHECK(dq.dtype() == dt);
    CHECK(dk.dtype() == dt);
    CHECK(dv.dtype() == dt);
  }
}

// Half inputs are computed as their f32 widening would be: every output equals the f32 path's on the
// widened inputs, rounded once to the half dtype, bit for bit. On Cpu and Reference the core widens
// (core/fused.hpp); Cuda takes half inputs itself (attention_half) and runs its tensor-core kernels
// without the products of the operands' zero low parts (backends/cuda/mma.cuh), which must add nothing.
// Head dims 32 to 128 (tensor-core tiles), dv = 47 (FMA kernels), GQA, key padding, additive and bool
// masks.
TEMPLATE_TEST_CASE("attention: bf16 and f16 equal the f32 path on their widened values, rounded once", "[attention]", KILN_BACKEND_TYPES) {
  using T = Tensor<TestType>;
  std::vector<Case> cases{kTileCases[0], kTileCases[1], kTileCases[4], kTileCases[5], kTileCases[6], kCases[1]};
  for (const Case& c : mask_cases())
    if (c.additive && cases.size() < 9) cases.push_back(c);
  const Case masked = with_mask({1, 2, 1, 70, 83, 64, 64, true, 13}, "B1TS", true);  // an additive mask on the tensor-core tiles
  cases.push_back(masked);
  cases.push_back(with_mask({2, 4, 2, 37, 53, 16, 16, false, 0, true}, "TS^T", false));  // a bool mask (transposed view), key padding
  if constexpr (std::is_same_v<TestType, Reference>) cases = {kCases[1], masked};        // the naive oracle: small cases
  const DType f = DType::f32;
  auto same = [](const T& got, const T& want, const char* what) {
    const std::vector<double> a = kt::host(got), b = kt::host(want);
    REQUIRE(a.size() == b.size());
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < a.size(); ++i)
      if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i]))) && bad++ == 0) first = i;
    INFO(what << ": " << bad << " of " << a.size() << " differ, first at " << first << ": " << (bad ? a[first] : 0.0) << " vs "
              << (bad ? b[first] : 0.0));
    CHECK(bad == 0);
  };
  uint64_t seed = 1300;
  exact_half_path<TestType>([&] {
    for (const Case& c : cases) {
      for (DType dt : {DType::bf16, DType::f16}) {
        INFO(c.str() << " " << dtype_name(dt));
        const Inputs<TestType> in = make_inputs<TestType>(c, dt, seed++);
        const T m32 = in.mask.defined() && in.mask.dtype() != DType::boolean ? in.mask.to(f) : in.mask;
        auto [o, lse] = fused::attention_forward(in.q, in.k, in.v, 0.2, c.causal, c.pos0, in.kp, in.mask);
        auto [o32, lse32] = fused::attention_forward(in.q.to(f), in.k.to(f), in.v.to(f), 0.2, c.causal, c.pos0, in.kp, m32);
        REQUIRE(o.dtype() == dt);
        REQUIRE(lse.dtype() == f);
        same(o, o32.to(dt), "O");
        same(lse, lse32, "LSE");
        auto [dq, dk, dv] = fused::attention_backward(in.q, in.k, in.v, o, lse, in.dout, 0.2, c.causal, c.pos0, in.kp, in.mask);
        auto [dq32, dk32, dv32] =
            fused::attention_backward(in.q.to(f), in.k.to(f), in.v.to(f), o.to(f), lse, in.dout.to(f), 0.2, c.causal, c.pos0, in.kp, m32);
        REQUIRE(dq.dtype() == dt);
        same(dq, dq32.to(dt), "dq");
        same(dk, dk32.to(dt), "dk");
        same(dv, dv32.to(dt), "dv");
      }
    }
  });
}

// The bf16/f16 forward against the f64 oracle on the same inputs, within half_forward_tol: on Cuda the
// half-precision tensor-core kernel (P rounded to the inputs' dtype; head dims multiples of 16 up to
// 128, both column tiles, GQA, causal with a KV-cache offset, key padding, additive and bool masks,
// transposed and unaligned rows, no keys), elsewhere (and for Cuda's other head dims) the exact path.
// LSE within the f32 bound: the softmax is f32 either way.
TEMPLATE_TEST_CASE("attention: the bf16/f16 forward is within its bound of the f64 oracle", "[attention]", KILN_BACKEND_TYPES) {
  std::vector<Case> cases{kTileCases[0], kTileCases[1], kTileCases[3], kTileCases[5], kTileCases[6], kTileCases[7], kCases[1], kCases[9]};
  const Case masked = with_mask({1, 2, 1, 70, 83, 64, 64, true, 13}, "B1TS", true);  // an additive mask (f32 to the backend)
  cases.push_back(masked);
  cases.push_back(with_mask({2, 4, 2, 37, 53, 32, 16, false, 0, true}, "TS^T", false));  // a bool mask (transposed view), key padding
  cases.push_back(Case{1, 2, 1, 40, 0, 16, 16, false, 0});                               // no keys: O = NaN, LSE = −inf
  if constexpr (std::is_same_v<TestType, Reference>) cases = {kCases[1], masked};        // the naive oracle: small cases
  const DType f64 = DType::f64;
  uint64_t seed = 1500;
  for (const Case& c : cases) {
    for (DType dt : {DType::bf16, DType::f16}) {
      INFO(c.str() << " " << dtype_name(dt));
      const Inputs<TestType> in = make_inputs<TestType>(c, dt, seed++);
      auto [o, lse] = fused::attention_forward(in.q, in.k, in.v, 0.2, c.causal, c.pos0, in.kp, in.mask);
      REQUIRE(o.dtype() == dt);
      REQUIRE(lse.dtype() == DType::f32);
      const Tensor<TestType> m64 = in.mask.defined() && in.mask.dtype() != DType::boolean ? in.mask.to(f64) : in.mask;
      auto [o64, lse64] = fused::attention_forward_composite(in.q.to(f64), in.k.to(f64), in.v.to(f64), 0.2, c.causal, c.pos0, in.kp, m64);
      const std::vector<double> want = kt::host(o64);
      compare(kt::host(o), want, half_forward_tol(c, in, dt, want), "O");
      compare(kt::host(lse), kt::host(lse64), {0.0, bound(c, DType::f32, max_score(in, c), 1.0).atol * 8}, "LSE");
      at_128_query_rows<TestType>([&] {  // Cuda: every row's arithmetic as at 64 rows per block
        auto [o128, lse128] = fused::attention_forward(in.q, in.k, in.v, 0.2, c.causal, c.pos0, in.kp, in.mask);
        same_values(kt::host(o128), kt::host(o), "O at 128 query rows per block");
        same_values(kt::host(lse128), kt::host(lse), "LSE at 128 query rows per block");
      });
    }
  }
#if defined(KILN_HAVE_CUDA_BACKEND)
  if constexpr (std::is_same_v<TestType, Cuda>) {
    REQUIRE_THROWS_WITH(cuda::set_attention_query_rows(96), Catch::Contains("rows must be 64, 128 or 0"));
    REQUIRE(cuda::attention_query_rows() == 0);
  }
#endif
}

// The bf16/f16 backward against the f64 oracle given the kernel's own O and LSE (so that D and P are
// the kernel's): f32 roundoff (bound) and the outputs' rounding to dt (2 u_store, relative), as the
// forward's, and where B rounds P and dS to dt for their products (Cuda's half products, as
// FlashAttention-2's backward) each P_ij off by at most u P_ij and each dS_ij by u |dS_ij| (f16: plus
// 2^-25 below its normal range), so more, per element:
//   dV: u Pᵀ|dO|,   dQ: u |dS| |K| <= u scale C P|K|,   dK: u |dS|ᵀ |Q| <= u scale C Pᵀ|Q|,
// as |dS_ij| = scale P_ij |dP_ij − D_i| <= scale P_ij C with C = 2 max‖dO_i‖ max‖V_j‖ (|dP_ij| <=
// ‖dO_i‖ ‖V_j‖, |D_i| <= ‖dO_i‖ ‖O_i‖, O_i a convex combination of V's rows). The elementwise terms
// come from the oracle: Pᵀ|dO| is its dV for the upstream gradient |dO|, P|K| its O for V = |K|, Pᵀ|Q|
// its dV for V = |K| and the upstream gradient |Q|. Cases as the forward's, with d and dv multiples of
// 16, which Cuda's half kernels take (the exact path's are the "equal the f32 path" test's).
TEMPLATE_TEST_CASE("attention: the bf16/f16 backward is within its bound of the f64 oracle", "[attention]", KILN_BACKEND_TYPES) {
  using T = Tensor<TestType>;
  std::vector<Case> cases{kTileCases[0], kTileCases[1], kTileCases[3], kTileCases[5], kTileCases[7], kCases[1]};
  const Case masked = with_mask({1, 2, 1, 70, 83, 64, 64, true, 13}, "B1TS", true);  // an additive mask (f32 to the backend)
  cases.push_back(masked);
  cases.push_back(with_mask({2, 4, 2, 37, 53, 32, 16, false, 0, true}, "TS^T", false));  // a bool mask (transposed view), key padding
  if constexpr (std::is_same_v<TestType, Reference>) cases = {kCases[1], masked};        // the naive oracle: small cases
  const DType f64 = DType::f64;
  const double scale = 0.2;
  auto row_norm_max = [](const T& x) { return std::sqrt(max_abs(kt::host(x.mul(x).sum({-1})))); };
  auto scaled = [](std::vector<double> x, double a) {
    for (double& e : x) e *= a;
    return x;
  };
  uint64_t seed = 1700;
  for (const Case& c : cases) {
    for (DType dt : {DType::bf16, DType::f16}) {
      INFO(c.str() << " " << dtype_name(dt));
      const Inputs<TestType> in = make_inputs<TestType>(c, dt, seed++);
      auto [o, lse] = fused::attention_forward(in.q, in.k, in.v, scale, c.causal, c.pos0, in.kp, in.mask);
      auto [dq, dk, dv] = fused::attention_backward(in.q, in.k, in.v, o, lse, in.dout, scale, c.causal, c.pos0, in.kp, in.mask);
      REQUIRE(dq.dtype() == dt);
      REQUIRE(dk.dtype() == dt);
      REQUIRE(dv.dtype() == dt);
      const T m64 = in.mask.defined() && in.mask.dtype() != DType::boolean ? in.mask.to(f64) : in.mask;
      const T q = in.q.to(f64), k = in.k.to(f64), v = in.v.to(f64), g = in.dout.to(f64), o64 = o.to(f64), l64 = lse.to(f64);
      auto oracle_bwd = [&](const T& vv, const T& oo, const T& gg) {
        return fused::attention_backward_composite(q, k, vv, oo, l64, gg, scale, c.causal, c.pos0, in.kp, m64);
      };
      const auto [wq, wk, wv] = oracle_bwd(v, o64, g);
      // [P|K|, ·] and [Pᵀ|Q|, Pᵀ|dO|] by one forward and one backward on V' = [|K|, V], dO' = [|Q|, |dO|]
      const T v2 = T::cat({k.abs(), v}, -1);
      const T o2 = fused::attention_forward_composite(q, k, v2, scale, c.causal, c.pos0, in.kp, m64).first;
      const T dv2 = std::get<2>(oracle_bwd(v2, o2, T::cat({q.abs(), g.abs()}, -1)));
      const T pk = o2.narrow(-1, 0, c.d);
      const std::vector<double> pq = kt::host(dv2.narrow(-1, 0, c.d)), pdo = kt::host(dv2.narrow(-1, c.d, c.dv));
      const double u = rounds_p<TestType>() ? 1.01 * kt::u_store(dt) : 0.0;
      const double C = 2.01 * row_norm_max(g) * row_norm_max(v);
      const double tiny = rounds_p<TestType>() && dt == DType::f16 ? std::ldexp(1.0, -25) : 0.0;  // f16 subnormal P, dS
      const double rep_t = static_cast<double>((c.H / c.Hkv) * c.T), ms = max_score(in, c);
      auto tol = [&](const std::vector<double>& want, double tiny_sum) {
        return kt::Tol{2 * kt::u_store(dt), bound(c, DType::f32, ms, max_abs(want)).atol + tiny_sum};
      };
      const std::vector<double> want_q = kt::host(wq), want_k = kt::host(wk), want_v = kt::host(wv);
      compare(kt::host(dv), want_v, tol(want_v, tiny * rep_t * max_abs(kt::host(g))), "dv", scaled(pdo, u));
      compare(kt::host(dq), want_q, tol(want_q, tiny * static_cast<double>(c.S) * max_abs(kt::host(k))), "dq",
              scaled(kt::host(pk), u * scale * C));
      compare(kt::host(dk), want_k, tol(want_k, tiny * rep_t * max_abs(kt::host(q))), "dk", scaled(pq, u * scale * C));
      at_128_query_rows<TestType>([&] {  // Cuda: the dQ pass's rows as at 64 query rows per block (dK, dV's pass is the same)
        auto [dq128, dk128, dv128] = fused::attention_backward(in.q, in.k, in.v, o, lse, in.dout, scale, c.causal, c.pos0, in.kp, in.mask);
        same_values(kt::host(dq128), kt::host(dq), "dq at 128 query rows per block");
        same_values(kt::host(dk128), kt::host(dk), "dk at 128 query rows per block");
        same_values(kt::host(dv128), kt::host(dv), "dv at 128 query rows per block");
      });
    }
  }
}

TEMPLATE_TEST_CASE("attention: outputs come in their inputs' memory order where the backend writes any layout", "[attention]",
                   KILN_BACKEND_TYPES) {
  using B = TestType;
  using T = Tensor<B>;
  Generator gen(41);
  // q, k, v as MultiHeadAttention passes them: [B, H, T, d] views of [B, T, H, d] projections.
  const T q = T::randn({2, 70, 4, 16}, DType::f32, &gen).transpose(1, 2), k = T::randn({2, 70, 2, 16}, DType::f32, &gen).transpose(1, 2),
          v = T::randn({2, 70, 2, 8}, DType::f32, &gen).transpose(1, 2), g = T::randn({2, 4, 70, 8}, DType::f32, &gen);
  const double scale = 0.25;
  auto [o, lse] = fused::attention_forward(q, k, v, scale, true, 0);
  auto [dq, dk, dv] = fused::attention_backward(q, k, v, o, lse, g, scale, true, 0);
  if constexpr (fused::AttentionAnyLayout<B>) {  // the head merge and the head split's backward are views
    CHECK(o.transpose(1, 2).is_contiguous());
    CHECK(dq.transpose(1, 2).is_contiguous());
    CHECK(dk.transpose(1, 2).is_contiguous());
    CHECK(dv.transpose(1, 2).is_contiguous());
  }
  // contiguous inputs: contiguous outputs, the same values bit for bit
  auto [o2, lse2] = fused::attention_forward(q.contiguous(), k.contiguous(), v.contiguous(), scale, true, 0);
  auto [dq2, dk2, dv2] = fused::attention_backward(q.contiguous(), k.contiguous(), v.contiguous(), o2, lse2, g, scale, true, 0);
  for (const T* t : {&o2, &dq2, &dk2, &dv2}) CHECK(t->is_contiguous());
  CHECK(max_abs(kt::host(o2.sub(o))) == 0.0);
  CHECK(max_abs(kt::host(dq2.sub(dq))) == 0.0);
  CHECK(max_abs(kt::host(dk2.sub(dk))) == 0.0);
  CHECK(max_abs(kt::host(dv2.sub(dv))) == 0.0);
}

TEMPLATE_TEST_CASE("attention: LSE is the row log-sum-exp of the masked scores", "[attention]", KILN_BACKEND_TYPES) {
  const Case c{1, 2, 1, 9, 12, 4, 3, true, 3, true};
  const Inputs<TestType> in = make_inputs<TestType>(c, DType::f64, 11);
  auto [o, lse] = fused::attention_forward(in.q, in.k, in.v, 0.5, c.causal, c.pos0, in.kp);
  const std::vector<double> q = kt::host(in.q), k = kt::host(in.k), l = kt::host(lse);
  const std::vector<double> kp = kt::host(in.kp.to(DType::f64));
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t i = 0; i < c.T; ++i) {
      double s = 0;
      for (int64_t j = 0; j <= std::min(c.S - 1, c.pos0 + i); ++j) {
        if (kp[static_cast<size_t>(j)] == 0) continue;
        double dot = 0;
        for (int64_t x = 0; x < c.d; ++x) dot += q[static_cast<size_t>((h * c.T + i) * c.d + x)] * k[static_cast<size_t>(j * c.d + x)];
        s += std::exp(0.5 * dot);
      }
      CHECK(l[static_cast<size_t>(h * c.T + i)] == Approx(std::log(s)).epsilon(1e-13));
    }
}

TEMPLATE_TEST_CASE("attention: gradcheck of the fused op in q, k, v (f64 finite differences)", "[attention]", KILN_BACKEND_TYPES) {
  Generator gen(5);
  using T = Tensor<TestType>;
  Tensor<TestType> kp = T::ones({2, 7}, DType::boolean);
  kp.narrow(1, 3, 1).fill_(0);
  for (bool causal : {true, false}) {
    INFO("causal " << causal);
    const auto r = gradcheck<TestType>([&](const std::vector<Var<TestType>>& x) { return nn::attention(x[0], x[1], x[2], causal, 2, kp); },
                                       {T::randn({2, 4, 5, 3}, DType::f64, &gen), T::randn({2, 7, 2, 3}, DType::f64, &gen).transpose(1, 2),
                                        T::randn({2, 2, 7, 6}, DType::f64, &gen)});
    INFO(r.message);
    CHECK(r.ok);
  }
}

TEMPLATE_TEST_CASE("attention: the decomposed path's soft cap (Gemma 2) against the formula and f64 finite differences", "[attention]",
                   KILN_BACKEND_TYPES) {
  Generator gen(6);
  using T = Tensor<TestType>;
  const T q = T::randn({1, 4, 5, 3}, DType::f64, &gen).mul(2), k = T::randn({1, 2, 7, 3}, DType::f64, &gen).mul(2),
          v = T::randn({1, 2, 7, 4}, DType::f64, &gen);
  const double cap = 0.7;
  // The formula on the host: softmax over the visible keys of cap·tanh(q·k/√3 / cap), GQA (2 query heads per kv head).
  const auto qv = q.template to_vector<double>(), kv = k.template to_vector<double>(), vv = v.template to_vector<double>();
  std::vector<double> want(4 * 5 * 4, 0.0);
  for (int h = 0; h < 4; ++h)
    for (int i = 0; i < 5; ++i) {
      const int pos = 2 + i, g = h / 2;  // pos0 2: keys 0..pos visible
      std::vector<double> p(7, 0.0);
      double m = -1e300, z = 0;
      for (int j = 0; j <= pos; ++j) {
        double sc = 0;
        for (int d = 0; d < 3; ++d) sc += qv[static_cast<size_t>((h * 5 + i) * 3 + d)] * kv[static_cast<size_t>((g * 7 + j) * 3 + d)];
        p[static_cast<size_t>(j)] = cap * std::tanh(sc / std::sqrt(3.0) / cap);
        m = std::max(m, p[static_cast<size_t>(j)]);
      }
      for (int j = 0; j <= pos; ++j) z += p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - m);
      for (int j = 0; j <= pos; ++j)
        for (int d = 0; d < 4; ++d)
          want[static_cast<size_t>((h * 5 + i) * 4 + d)] += p[static_cast<size_t>(j)] / z * vv[static_cast<size_t>((g * 7 + j) * 4 + d)];
    }
  const auto got = nn::attention_decomposed(Var<TestType>(q), Var<TestType>(k), Var<TestType>(v), true, 2, {}, {}, cap).value();
  kt::check_close(got, Tensor<Reference>::from_vector(want, {1, 4, 5, 4}), {.rtol = 1e-12, .atol = 1e-12}, "soft-capped attention");
  // No cap is the plain decomposed attention, and a cap changes it.
  const auto plain = nn::attention_decomposed(Var<TestType>(q), Var<TestType>(k), Var<TestType>(v), true, 2).value();
  CHECK(plain.sub(got).abs().max().template item<double>() > 1e-3);
  const auto r = gradcheck<TestType>(
      [&](const std::vector<Var<TestType>>& x) { return nn::attention_decomposed(x[0], x[1], x[2], true, 2, {}, {}, cap); }, {q, k, v});
  INFO(r.message);
  CHECK(r.ok);
  CHECK_THROWS_WITH(nn::attention_decomposed(Var<TestType>(q), Var<TestType>(k), Var<TestType>(v), true, 2, {}, {}, -1.0),
                    Catch::Contains("softcap must be finite and >= 0"));
}

// The soft-capped cases: the file's cases (decoding, GQA, ragged tiles, private dQ buffers, layouts,
// padding) and one of each mask kind, with a cap of 1.5 that most rows' largest scores (up to ~4 here)
// reach, for backends that cap in their kernels (Cpu: the row passes). Where the call takes the
// composite path (Reference; Cuda, whose kernels have no cap) one code path serves every case: four of
// them (plain, decoding with GQA, padding, an additive mask).
template <Backend B> std::vector<Case> softcap_cases() {
  std::vector<Case> out = kCases;
  const std::vector<Case> masks = mask_cases();
  for (size_t i = 0; i < masks.size(); i += 3) out.push_back(masks[i]);
  if (!fused::AttentionSoftcap<B>) out = {kCases[0], kCases[2], kCases[9], masks[3]};
  for (Case& c : out) c.softcap = 1.5;
  return out;
}

TEMPLATE_TEST_CASE("attention: Gemma 2's soft cap in the fused op matches the decomposed oracle (f64, f32 vs f64 oracle)",
                   "[attention][softcap]", KILN_BACKEND_TYPES) {
  uint64_t seed = 700;
  for (const Case& c : softcap_cases<TestType>()) {
    check_case<TestType>(c, DType::f64, seed);
    check_case<TestType>(c, DType::f32, 100 + seed++);
  }
}

TEMPLATE_TEST_CASE("attention: the fused soft cap's gradients (f64 finite differences), its bf16 rounding, its node and its errors",
                   "[attention][softcap]", KILN_BACKEND_TYPES) {
  using T = Tensor<TestType>;
  Generator gen(31);
  // Scores up to ~6: the cap (2) bends them; causal from pos0 2 with GQA, an additive mask and padding.
  const T q = T::randn({2, 4, 5, 3}, DType::f64, &gen).mul(2.0), k = T::randn({2, 2, 7, 3}, DType::f64, &gen).mul(2.0);
  const T v = T::randn({2, 2, 7, 4}, DType::f64, &gen);
  T kp = T::ones({2, 7}, DType::boolean);
  kp.narrow(1, 5, 1).fill_(0);
  const T mask = T::randn({5, 7}, DType::f64, &gen);
  const double cap = 2.0;
  auto fused = [&](const std::vector<Var<TestType>>& x) { return nn::attention(x[0], x[1], x[2], true, 2, kp, mask, cap); };
  const auto r = gradcheck<TestType>(fused, {q, k, v});
  INFO(r.message);
  CHECK(r.ok);
  // the same values as the decomposed path, and not those of the uncapped attention
  const T got = fused({Var<TestType>(q), Var<TestType>(k), Var<TestType>(v)}).value();
  const T want = nn::attention_decomposed(Var<TestType>(q), Var<TestType>(k), Var<TestType>(v), true, 2, kp, mask, cap).value();
  compare(kt::host(got), kt::host(want), {1e-13, 1e-13}, "O, capped");
  CHECK(nn::attention(Var<TestType>(q), Var<TestType>(k), Var<TestType>(v), true, 2, kp, mask)
            .value()
            .sub(got)
            .abs()
            .max()
            .template item<double>() > 1e-2);
  // bf16 and f16: the f32 computation on the widened inputs, O rounded once (as without a cap)
  for (const DType h : {DType::bf16, DType::f16}) {
    INFO(dtype_name(h));
    const T qh = q.to(h), kh = k.to(h), vh = v.to(h);
    const T oh = nn::attention(Var<TestType>(qh), Var<TestType>(kh), Var<TestType>(vh), true, 2, kp, mask.to(h), cap).value();
    const T o32 = nn::attention(Var<TestType>(qh.to(DType::f32)), Var<TestType>(kh.to(DType::f32)), Var<TestType>(vh.to(DType::f32)), true,
                                2, kp, mask.to(h).to(DType::f32), cap)
                      .value();
    CHECK(oh.dtype() == h);
    CHECK(kt::host(oh) == kt::host(o32.to(h)));
  }
  // The node keeps q, k, v, O and LSE: nothing of size T·S, with the cap as without it.
  Var<TestType> qv(T::randn({1, 2, 128, 8}), true), kv(T::randn({1, 1, 128, 8}), true), vv(T::randn({1, 1, 128, 8}), true);
  const Var<TestType> o = nn::attention(qv, kv, vv, true, 0, {}, {}, 30.0);
  const auto* saved = o.node()->backward.template target<autograd::AttentionBackward<TestType>>();
  REQUIRE(saved != nullptr);
  CHECK(saved->softcap == 30.0);
  for (const T& t : saved->saved())
    if (t.defined()) CHECK(t.numel() < 128 * 128);
  for (const double bad : {-1.0, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()})
    CHECK_THROWS_WITH(nn::attention(qv, kv, vv, true, 0, {}, {}, bad),
                      Catch::Contains("attention_forward: softcap must be finite and >= 0 (0: none)"));
}

TEMPLATE_TEST_CASE("attention: the autograd node saves q, k, v, O, LSE and nothing of size T·S", "[attention]", KILN_BACKEND_TYPES) {
  using T = Tensor<TestType>;
  const int64_t Bn = 1, H = 2, Tn = 256, S = 256, d = 8;
  Var<TestType> q(T::randn({Bn, H, Tn, d}), true), k(T::randn({Bn, 1, S, d}), true), v(T::randn({Bn, 1, S, d}), true);
  const Var<TestType> o = nn::attention(q, k, v, true, 0);
  const auto* saved = o.node()->backward.template target<autograd::AttentionBackward<TestType>>();
  REQUIRE(saved != nullptr);
  size_t bytes = 0;
  for (const T& t : saved->saved()) {
    if (!t.defined()) continue;
    CHECK(t.numel() < Tn * S);
    bytes += static_cast<size_t>(t.numel()) * dtype_size(t.dtype());
  }
  const size_t expect = static_cast<size_t>(q.numel() + k.numel() + v.numel() + o.numel() + Bn * H * Tn) * 4;
  CHECK(bytes == expect);                            // the decomposed path keeps (at least) the [B, H, T, S] probabilities: 2 MiB here
  CHECK(saved->o.storage() == o.value().storage());  // O is the output itself, not a copy
  {
    NoGrad ng;
    CHECK(nn::attention(q, k, v, true, 0).grad_fn() == nullptr);
  }
}

TEMPLATE_TEST_CASE("attention: a row with no visible key gives NaN (as PyTorch) and a zero gradient", "[attention]", KILN_BACKEND_TYPES) {
  using T = Tensor<TestType>;
  Generator gen(9);
  T kp = T::ones({1, 6}, DType::boolean);
  kp.narrow(1, 0, 2).fill_(0);  // keys 0, 1 padded: causal rows 0 and 1 see nothing
  Var<TestType> q(T::randn({1, 2, 6, 4}, DType::f64, &gen), true), k(T::randn({1, 2, 6, 4}, DType::f64, &gen), true),
      v(T::randn({1, 2, 6, 5}, DType::f64, &gen), true);
  const Var<TestType> o = nn::attention(q, k, v, true, 0, kp);
  const Var<TestType> od = nn::attention_decomposed(q, k, v, true, 0, kp);
  compare(kt::host(o.value()), kt::host(od.value()), {1e-14, 1e-14}, "O with NaN rows");
  const std::vector<double> ov = kt::host(o.value());
  CHECK(std::isnan(ov[0]));
  CHECK(std::isfinite(ov[2 * 5]));
  o.backward(T::ones(o.shape(), DType::f64));
  const std::vector<double> dq = kt::host(q.grad());
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t x = 0; x < 2 * 4; ++x) CHECK(dq[static_cast<size_t>(h * 24 + x)] == 0.0);
  for (double g : kt::host(k.grad())) CHECK(std::isfinite(g));
  for (double g : kt::host(v.grad())) CHECK(std::isfinite(g));
}

TEMPLATE_TEST_CASE("attention: differential attention's fused form and dλ match the decomposed path", "[attention][diff]", Reference, Cpu) {
  using T = Tensor<TestType>;
  Generator gen(21);
  const int64_t Bn = 2, h = 4, hkv = 2, Tn = 37, S = 45, d = 8, pos0 = 8;
  const T q1 = T::randn({Bn, h, Tn, d}, DType::f64, &gen), q2 = T::randn({Bn, h, Tn, d}, DType::f64, &gen);
  const T k1 = T::randn({Bn, hkv, S, d}, DType::f64, &gen), k2 = T::randn({Bn, hkv, S, d}, DType::f64, &gen);
  const T v = T::randn({Bn, hkv, S, 2 * d}, DType::f64, &gen), dout = T::randn({Bn, h, Tn, 2 * d}, DType::f64, &gen);
  std::vector<std::vector<double>> res[2];
  for (int fusedi = 0; fusedi < 2; ++fusedi) {
    std::vector<Var<TestType>> x{Var<TestType>(q1, true), Var<TestType>(k1, true), Var<TestType>(q2, true),
                                 Var<TestType>(k2, true), Var<TestType>(v, true),  Var<TestType>(T::scalar(0.37, DType::f64), true)};
    auto att = [&](const Var<TestType>& a, const Var<TestType>& b) {
      return fusedi ? nn::attention(a, b, x[4], true, pos0) : nn::attention_decomposed(a, b, x[4], true, pos0);
    };
    const Var<TestType> a2 = att(x[2], x[3]);
    const Var<TestType> o = att(x[0], x[1]) - a2 * x[5];
    o.backward(dout);
    res[fusedi].push_back(kt::host(o.value()));
    for (auto& xi : x) res[fusedi].push_back(kt::host(xi.grad()));
    // docs/specs.md §1: dλ = −Σ dO ⊙ FA(Q2, K2, V)
    CHECK(x[5].grad().template item<double>() == Approx(-dout.mul(a2.value()).sum().template item<double>()).epsilon(1e-12));
  }
  const char* names[] = {"O", "dq1", "dk1", "dq2", "dk2", "dv", "dλ"};
  const Case c{Bn, h, hkv, Tn, S, d, 2 * d, true, pos0};
  const double ms = std::max(max_score(Inputs<TestType>{q1, k1, v, {}, dout}, c), max_score(Inputs<TestType>{q2, k2, v, {}, dout}, c));
  for (size_t i = 0; i < res[0].size(); ++i) {
    // f64 on both sides: twice the bound of the file's header; dλ is a sum over every output element
    // (Σ |dO| |FA(Q2, K2, V)| <= numel · max|dO| · max|v|)
    const double m = i == 6 ? static_cast<double>(dout.numel()) * max_abs(kt::host(dout)) * max_abs(kt::host(v)) : max_abs(res[0][i]);
    compare(res[1][i], res[0][i], {0.0, 2 * bound(c, DType::f64, ms, m).atol}, names[i]);
  }
}

TEMPLATE_TEST_CASE("attention: DifferentialAttention and MHA run the fused op", "[attention]", KILN_BACKEND_TYPES) {
  nn::DiffAttentionOptions o;
  o.d_model = 16;
  o.n_heads = 2;
  o.depth = 1;
  o.dtype = DType::f64;
  nn::DifferentialAttention<TestType> da(o);
  Var<TestType> x(Tensor<TestType>::randn({2, 5, 16}, DType::f64), true);
  da.forward(x).sum().backward();
  CHECK(x.grad().defined());
  nn::MultiHeadAttention<TestType> mha(nn::AttentionOptions{.d_model = 16, .n_heads = 4, .n_kv_heads = 2, .dtype = DType::f64});
  Var<TestType> x2(Tensor<TestType>::randn({2, 5, 16}, DType::f64), true);
  mha.forward(x2).sum().backward();
  CHECK(x2.grad().defined());
}

TEMPLATE_TEST_CASE("attention: bad shapes and dtypes throw kiln::Error naming the op and shapes", "[attention][errors]",
                   KILN_BACKEND_TYPES) {
  using T = Tensor<TestType>;
  const T q = T::randn({1, 4, 5, 8}), k = T::randn({1, 3, 6, 8}), v = T::randn({1, 3, 6, 8});
  CHECK_THROWS_WITH(fused::attention_forward(q, k, v, 1.0, true, 0),
                    Catch::Contains("attention_forward") && Catch::Contains("[1, 4, 5, 8]"));
  const T k2 = T::randn({1, 2, 6, 7});
  CHECK_THROWS_WITH(fused::attention_forward(q, k2, T::randn({1, 2, 6, 8}), 1.0, false, 0), Catch::Contains("do not fit"));
  CHECK_THROWS_WITH(fused::attention_forward(q, T::randn({1, 2, 6, 8}, DType::f64), T::randn({1, 2, 6, 8}), 1.0, false, 0),
                    Catch::Contains("dtype"));
  CHECK_THROWS_WITH(
      fused::attention_forward(q, T::randn({1, 2, 6, 8}), T::randn({1, 2, 6, 8}), 1.0, true, 0, T::ones({1, 5}, DType::boolean)),
      Catch::Contains("key_padding"));
  CHECK_THROWS_WITH(fused::attention_forward(q, T::randn({1, 2, 6, 8}), T::randn({1, 2, 6, 8}), 1.0, true, -1), Catch::Contains("pos0"));
  CHECK_THROWS_AS(nn::attention(Var<TestType>(T::randn({4, 5, 8})), Var<TestType>(k), Var<TestType>(v), true, 0), kiln::Error);
  CHECK_THROWS_WITH(fused::attention_forward(T::ones({1, 1, 2, 2}, DType::i32), T::ones({1, 1, 2, 2}, DType::i32),
                                             T::ones({1, 1, 2, 2}, DType::i32), 1.0, false, 0),
                    Catch::Contains("float"));
}

TEMPLATE_TEST_CASE("attention: gradcheck with bool and additive masks, causal, key padding and GQA (f64)", "[attention][mask]",
                   KILN_BACKEND_TYPES) {
  using T = Tensor<TestType>;
  Generator gen(15);
  T kp = T::ones({2, 7}, DType::boolean);
  kp.narrow(1, 4, 1).fill_(0);
  T keep = T::rand({5, 7}, DType::f64, &gen).gt(0.3);
  keep.narrow(1, 0, 1).fill_(1);
  T add = T::randn({2, 1, 5, 7}, DType::f64, &gen);
  add.narrow(3, 2, 1).fill_(-INFINITY);
  for (const T& mask : {keep, add}) {
    for (bool causal : {true, false}) {
      INFO("causal " << causal << " mask " << dtype_name(mask.dtype()));
      const auto r =
          gradcheck<TestType>([&](const std::vector<Var<TestType>>& x) { return nn::attention(x[0], x[1], x[2], causal, 2, kp, mask); },
                              {T::randn({2, 4, 5, 3}, DType::f64, &gen), T::randn({2, 7, 2, 3}, DType::f64, &gen).transpose(1, 2),
                               T::randn({2, 2, 7, 6}, DType::f64, &gen)});
      INFO(r.message);
      CHECK(r.ok);
    }
  }
}

TEMPLATE_TEST_CASE("attention: with a mask the node saves the user's mask as given and nothing else of size T·S", "[attention][mask]",
                   KILN_BACKEND_TYPES) {
  using T = Tensor<TestType>;
  const int64_t Bn = 2, H = 2, Tn = 128, S = 96, d = 8;
  Var<TestType> q(T::randn({Bn, H, Tn, d}), true), k(T::randn({Bn, 1, S, d}), true), v(T::randn({Bn, 1, S, d}), true);
  const T small = T::randn({Bn, 1, 1, S});  // padding-like additive mask
  const T ts = T::rand({Tn, S}).gt(0.2);    // a [T, S] bool mask: the user's own T·S tensor
  for (const T& mask : {small, ts}) {
    INFO("mask " << shape_str(mask.shape()));
    const Var<TestType> o = nn::attention(q, k, v, false, 0, {}, mask);
    const auto* saved = o.node()->backward.template target<autograd::AttentionBackward<TestType>>();
    REQUIRE(saved != nullptr);
    CHECK(saved->mask.storage() == mask.storage());  // the very tensor, not an expanded copy
    CHECK(saved->mask.shape() == mask.shape());
    size_t bytes = 0;
    for (const T& t : saved->saved()) {
      if (!t.defined() || t.storage() == mask.storage()) continue;
      CHECK(t.numel() < Tn * S);
      bytes += static_cast<size_t>(t.numel()) * dtype_size(t.dtype());
    }
    CHECK(bytes == static_cast<size_t>(q.numel() + k.numel() + v.numel() + o.numel() + Bn * H * Tn) * 4);
    o.backward(T::ones(o.shape()));  // and the backward runs from what was saved
    CHECK(q.grad().defined());
    q.zero_grad();
  }
}

TEMPLATE_TEST_CASE("attention: a row the mask hides entirely gives NaN and a zero gradient, additive −inf equals bool false",
                   "[attention][mask]", KILN_BACKEND_TYPES) {
  using T = Tensor<TestType>;
  Generator gen(19);
  T keep = T::ones({5, 6}, DType::boolean);
  keep.narrow(0, 1, 1).fill_(0);  // query 1 sees nothing
  keep.narrow(0, 3, 1).narrow(1, 2, 3).fill_(0);
  const T add = T::where(keep, T::zeros({}, DType::f64), T::full({}, -INFINITY, DType::f64));
  Var<TestType> q(T::randn({1, 2, 5, 4}, DType::f64, &gen), true), k(T::randn({1, 1, 6, 4}, DType::f64, &gen), true),
      v(T::randn({1, 1, 6, 3}, DType::f64, &gen), true);
  const Var<TestType> ob = nn::attention(q, k, v, false, 0, {}, keep);
  const Var<TestType> oa = nn::attention(q, k, v, false, 0, {}, add);
  compare(kt::host(oa.value()), kt::host(ob.value()), {0.0, 0.0}, "additive vs bool");
  const std::vector<double> o = kt::host(ob.value());
  for (int64_t h = 0; h < 2; ++h) {
    CHECK(std::isnan(o[static_cast<size_t>((h * 5 + 1) * 3)]));
    CHECK(std::isfinite(o[static_cast<size_t>((h * 5 + 3) * 3)]));
  }
  ob.backward(T::ones(ob.shape(), DType::f64));
  const std::vector<double> dq = kt::host(q.grad());
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t x = 0; x < 4; ++x) CHECK(dq[static_cast<size_t>((h * 5 + 1) * 4 + x)] == 0.0);
  for (double g : kt::host(k.grad())) CHECK(std::isfinite(g));
  for (double g : kt::host(v.grad())) CHECK(std::isfinite(g));
}

TEMPLATE_TEST_CASE("attention: bf16 / f16 with an additive mask of the same dtype stay within the f64 oracle's bound", "[attention][mask]",
                   KILN_BACKEND_TYPES) {
  Case c{2, 4, 2, 37, 53, 16, 16, true, 16};
  c.mask = "B1TS";
  c.additive = true;
  for (DType dt : {DType::bf16, DType::f16}) {
    INFO(dtype_name(dt));
    const Inputs<TestType> in = make_inputs<TestType>(c, dt, 8);
    REQUIRE(in.mask.dtype() == dt);
    auto [o, lse] = fused::attention_forward(in.q, in.k, in.v, 0.25, c.causal, c.pos0, {}, in.mask);
    CHECK(o.dtype() == dt);
    auto [o64, lse64] = fused::attention_forward_composite(in.q.to(DType::f64), in.k.to(DType::f64), in.v.to(DType::f64), 0.25, c.causal,
                                                           c.pos0, {}, in.mask.to(DType::f64));
    const std::vector<double> want = kt::host(o64);
    compare(kt::host(o), want, half_forward_tol(c, in, dt, want), "O");
    auto [dq, dk, dv] = fused::attention_backward(in.q, in.k, in.v, o, lse, in.dout, 0.25, c.causal, c.pos0, {}, in.mask);
    CHECK(dq.dtype() == dt);
  }
}

TEMPLATE_TEST_CASE("attention: bad masks throw kiln::Error naming the op and shapes", "[attention][mask][errors]", KILN_BACKEND_TYPES) {
  using T = Tensor<TestType>;
  const T q = T::randn({2, 4, 5, 8}), k = T::randn({2, 2, 6, 8}), v = T::randn({2, 2, 6, 8});
  auto fwd = [&](const T& m) { return fused::attention_forward(q, k, v, 1.0, false, 0, {}, m); };
  CHECK_THROWS_WITH(fwd(T::ones({5, 5}, DType::boolean)),
                    Catch::Contains("attention_forward") && Catch::Contains("mask [5, 5]") && Catch::Contains("[2, 4, 5, 6]"));
  CHECK_THROWS_WITH(fwd(T::ones({3, 1, 5, 6}, DType::boolean)), Catch::Contains("mask [3, 1, 5, 6]"));
  CHECK_THROWS_WITH(fwd(T::ones({2, 4, 5, 6}).unsqueeze(0)), Catch::Contains("mask [1, 2, 4, 5, 6]"));
  CHECK_THROWS_WITH(fwd(T::ones({5, 6}, DType::f64)), Catch::Contains("mask") && Catch::Contains("f64") && Catch::Contains("f32"));
  CHECK_THROWS_WITH(fwd(T::ones({5, 6}, DType::i64)), Catch::Contains("mask") && Catch::Contains("i64"));
  CHECK_THROWS_WITH(nn::attention(Var<TestType>(q), Var<TestType>(k), Var<TestType>(v), true, 0, {}, T::ones({6, 5}, DType::boolean)),
                    Catch::Contains("mask [6, 5]"));
}

// ------------------------------------------------------------------- fused differential attention
// nn::diff_attention (core/fused_diff_attention.hpp: the composite default on Reference and Cuda, one
// kernel for both branches on Cpu) against two decomposed attentions over the branch views,
// O = A(q1, k1, v) − λ·A(q2, k2, v), forward and every gradient (q, k, v, λ), in the bound of the
// file's header (dλ: a sum over every output element, Σ |dO| |A2| <= numel · max|dO| · max|v|).
namespace {

struct DiffResult {
  std::vector<double> o, dq, dk, dv, dlam;
};

// Differential operands from a case: q [B, H, 2, T, d], k [B, Hkv, 2, S, d] (layout 1: permuted views
// of [B, T, H, 2, d] projections, as DifferentialAttention passes them), v and the rest as make_inputs.
template <Backend B> std::pair<Inputs<B>, Inputs<B>> make_diff_inputs(const Case& c, DType dt, uint64_t seed) {
  Inputs<B> in = make_inputs<B>(c, dt, seed);
  Generator gen(seed + 7);
  auto rnd = [&](Shape s) { return Tensor<B>::randn(s, DType::f32, &gen).to(dt); };
  Inputs<B> b = in;
  if (c.layout == 1) {
    b.q = rnd({c.B, c.T, c.H, 2, c.d}).permute({0, 2, 3, 1, 4});
    b.k = rnd({c.B, c.S, c.Hkv, 2, c.d}).permute({0, 2, 3, 1, 4});
  } else {
    b.q = rnd({c.B, c.H, 2, c.T, c.d});
    b.k = rnd({c.B, c.Hkv, 2, c.S, c.d});
  }
  return {in, b};
}

template <Backend B> DiffResult run_diff(const Inputs<B>& in, const Case& c, double lam, DType dt, bool fused) {
  Var<B> q(in.q.to(dt), true), k(in.k.to(dt), true), v(in.v.to(dt), true), l(Tensor<B>::scalar(lam, dt), true);
  const Tensor<B> mask = in.mask.defined() && in.mask.dtype() != DType::boolean ? in.mask.to(dt) : in.mask;
  Var<B> o;
  if (fused) {
    o = nn::diff_attention(q, k, v, l, c.causal, c.pos0, in.kp, mask);
    CHECK(std::string(o.grad_fn()) == "diff_attention");
  } else {
    auto att = [&](int x) { return nn::attention_decomposed(q.select(2, x), k.select(2, x), v, c.causal, c.pos0, in.kp, mask); };
    o = att(0) - att(1) * l;
  }
  o.backward(in.dout.to(dt));
  return {kt::host(o.value()), kt::host(q.grad()), kt::host(k.grad()), kt::host(v.grad()), kt::host(l.grad())};
}

template <Backend B> void check_diff_case(const Case& c, DType dt, uint64_t seed, double lam) {
  INFO(c.str() << " dtype " << dtype_name(dt) << " lambda " << lam);
  const Inputs<B> in = make_diff_inputs<B>(c, dt, seed).second;
  const DiffResult got = run_diff(in, c, lam, dt, true);
  const DiffResult want = run_diff(in, c, lam, DType::f64, false);
  const double ms = max_score(in, c);
  const double f = 1 + std::abs(lam);  // two maps, the second times λ
  auto tol = [&](const std::vector<double>& w) { return kt::Tol{0.0, f * bound(c, dt, ms, max_abs(w)).atol}; };
  compare(got.o, want.o, tol(want.o), "O");
  compare(got.dq, want.dq, tol(want.dq), "dq (both branches)");
  compare(got.dk, want.dk, tol(want.dk), "dk (both branches)");
  compare(got.dv, want.dv, tol(want.dv), "dv");
  const double mlam = static_cast<double>(in.dout.numel()) * max_abs(kt::host(in.dout)) * max_abs(kt::host(in.v));
  compare(got.dlam, want.dlam, {0.0, f * bound(c, dt, ms, mlam).atol}, "dλ");
}

// kCases with q and k of two branches: causal, KV-cache offsets, GQA, d != dv, ragged tiles, one
// (batch, kv head) unit (private dQ buffers), key padding, permuted projections; plus masks.
std::vector<Case> diff_cases() {
  std::vector<Case> out;
  for (Case c : kCases) {
    if (c.layout == 2) c.layout = 0;  // (strided last dims have no 5-D analogue here)
    out.push_back(c);
  }
  const std::vector<Case> m = mask_cases();
  out.push_back(m[0]);  // bool [T, S] with causal, padding, GQA
  out.push_back(m[3]);  // additive [S] ... (the shapes cycle through the three mask base cases)
  out.push_back(m[8]);  // bool [1, H, T, S]
  return out;
}

}  // namespace

TEMPLATE_TEST_CASE("diff_attention: fused forward and backward match two decomposed attentions (f64)", "[attention][diff]",
                   KILN_BACKEND_TYPES) {
  uint64_t seed = 300;
  double lam = 0.8;
  for (const Case& c : diff_cases()) {
    check_diff_case<TestType>(c, DType::f64, seed++, lam);
    lam = -0.6 * lam + 0.1;  // positive, negative and near zero
  }
}

TEMPLATE_TEST_CASE("diff_attention: fused forward and backward match two decomposed attentions (f32 vs f64 oracle)", "[attention][diff]",
                   Reference, Cpu) {
  uint64_t seed = 400;
  for (const Case& c : diff_cases()) check_diff_case<TestType>(c, DType::f32, seed++, 0.45);
}

// ---- the Cpu kernel's row work in its tile products' epilogues (backends/cpu/attention.cpp: the
// backward's P = exp(S − LSE) and dS, and the forward's online-softmax step: on AVX-512 in the
// epilogue, on AVX2 row by row in registers right after the product) runs the
// formulas of the row passes that tiles with key padding or a mask take, in the same order. An
// all-true key padding sends the same inputs through those passes: every output and gradient must
// come out bit for bit the same. The tile cases (ragged tiles, every causal key count, KV-cache
// offsets, GQA, strided views) for attention and for both branches of differential attention; at the
// best ISA here, at AVX2 by the isa-avx2 entry and at baseline (no epilogues: trivially equal).
// (One thread: the comparison is of the two row paths, not of thread counts.)
TEMPLATE_TEST_CASE("attention: the tile products' epilogues equal the separate row passes bit for bit (f32)", "[attention][tile]", Cpu) {
  using T = Tensor<TestType>;
  const kt::Tol exact{0.0, 0.0};
  struct OneThread {
    int n0 = num_threads();
    OneThread() { set_num_threads(1); }
    ~OneThread() { set_num_threads(n0); }
  } one_thread;
  uint64_t seed = 950;
  for (Case c : kTileCases) {
    c.padding = false;
    INFO(c.str());
    Inputs<TestType> in = make_inputs<TestType>(c, DType::f32, seed++);
    const Result fused = run(in, c, DType::f32, true);
    in.kp = T::ones({c.B, c.S}, DType::boolean);
    const Result passes = run(in, c, DType::f32, true);
    compare(fused.o, passes.o, exact, "O");
    compare(fused.dq, passes.dq, exact, "dq");
    compare(fused.dk, passes.dk, exact, "dk");
    compare(fused.dv, passes.dv, exact, "dv");
  }
  for (Case c : kTileCases) {
    if (c.layout == 2) c.layout = 0;
    c.padding = false;
    INFO("differential " << c.str());
    Inputs<TestType> in = make_diff_inputs<TestType>(c, DType::f32, seed++).second;
    const DiffResult fused = run_diff(in, c, 0.45, DType::f32, true);
    in.kp = T::ones({c.B, c.S}, DType::boolean);
    const DiffResult passes = run_diff(in, c, 0.45, DType::f32, true);
    compare(fused.o, passes.o, exact, "O");
    compare(fused.dq, passes.dq, exact, "dq (both branches)");
    compare(fused.dk, passes.dk, exact, "dk (both branches)");
    compare(fused.dv, passes.dv, exact, "dv");
    compare(fused.dlam, passes.dlam, exact, "dλ");
  }
}

// With fewer (batch, kv head) units than threads the Cpu backward splits each unit's key tiles over the
// threads and sums dQ from per-thread buffers. The tiles were once dealt dynamically, so a thread's share,
// and with it dq's last bits, depended on timing. Dealt round robin now: every run at a thread count
// gives the same bits. (A timing-dependent deal shows up in a few of the repeats on 2 busy cores, not
// in every run of this test.)
TEMPLATE_TEST_CASE("attention: the backward's split over key tiles gives the same bits in every run (f32, 2 threads)", "[attention]", Cpu) {
  struct TwoThreads {
    int n0 = num_threads();
    TwoThreads() { set_num_threads(2); }
    ~TwoThreads() { set_num_threads(n0); }
  } two;
  for (const Case& c : {Case{1, 2, 1, 320, 320, 64, 64, true, 0}, Case{1, 1, 1, 150, 400, 32, 32, true, 250}}) {
    INFO(c.str());
    const Inputs<TestType> in = make_inputs<TestType>(c, DType::f32, 4242);
    const Result first = run(in, c, DType::f32, true);
    for (int rep = 0; rep < 12; ++rep) {
      const Result again = run(in, c, DType::f32, true);
      compare(first.dq, again.dq, {0.0, 0.0}, "dq");
      compare(first.dk, again.dk, {0.0, 0.0}, "dk");
      compare(first.dv, again.dv, {0.0, 0.0}, "dv");
    }
  }
}

TEMPLATE_TEST_CASE("diff_attention: gradcheck in q, k, v and lambda (f64 finite differences)", "[attention][diff]", KILN_BACKEND_TYPES) {
  Generator gen(31);
  using T = Tensor<TestType>;
  T kp = T::ones({2, 7}, DType::boolean);
  kp.narrow(1, 3, 1).fill_(0);
  for (bool causal : {true, false}) {
    INFO("causal " << causal);
    const auto r = gradcheck<TestType>(
        [&](const std::vector<Var<TestType>>& x) { return nn::diff_attention(x[0], x[1], x[2], x[3], causal, 2, kp); },
        {T::randn({2, 5, 4, 2, 3}, DType::f64, &gen).permute({0, 2, 3, 1, 4}), T::randn({2, 2, 2, 7, 3}, DType::f64, &gen),
         T::randn({2, 2, 7, 6}, DType::f64, &gen), T::scalar(0.3, DType::f64)});
    INFO(r.message);
    CHECK(r.ok);
  }
}

TEMPLATE_TEST_CASE("diff_attention: dq and dk come back as one tensor in q's and k's memory order", "[attention][diff]",
                   KILN_BACKEND_TYPES) {
  using T = Tensor<TestType>;
  Generator gen(41);
  // q, k as DifferentialAttention passes them: [B, T, H, 2, d] projections seen as [B, H, 2, T, d]
  Var<TestType> q(T::randn({2, 9, 3, 2, 4}, DType::f32, &gen).permute({0, 2, 3, 1, 4}), true);
  Var<TestType> k(T::randn({2, 9, 3, 2, 4}, DType::f32, &gen).permute({0, 2, 3, 1, 4}), true);
  Var<TestType> v(T::randn({2, 3, 9, 8}, DType::f32, &gen), true), l(T::scalar(0.5), true);
  const Var<TestType> o = nn::diff_attention(q, k, v, l, true, 0);
  const auto* saved = o.node()->backward.template target<autograd::DiffAttentionBackward<TestType>>();
  REQUIRE(saved != nullptr);
  for (const T& t : saved->saved())
    if (t.defined()) CHECK(t.numel() < 9 * 9 * 3 * 2);  // nothing of size T·S per head
  CHECK(saved->o.storage() == o.value().storage());     // O is the output itself, not a copy
  // (backward frees the node's closure: keep what the check below needs)
  const T dout = T::randn(o.shape(), DType::f32, &gen), saved_o = saved->o, o2 = saved->o2, lse1 = saved->lse1, lse2 = saved->lse2;
  o.backward(dout);
  if constexpr (std::is_same_v<TestType, Cpu>) {  // the Cpu kernel writes them in place: no copy per branch
    auto [dq, dk, dv, dlam] = fused::diff_attention_backward(q.value(), k.value(), v.value(), l.value(), saved_o, o2, lse1, lse2, dout, 0.5,
                                                             true, 0);  // scale 1/√d, d = 4
    CHECK(dq.permute({0, 3, 1, 2, 4}).is_contiguous());                 // [B, T, H, 2, d], as the projection
    CHECK(dk.permute({0, 3, 1, 2, 4}).is_contiguous());
    compare(kt::host(dq), kt::host(q.grad()), {0.0, 0.0}, "dq as the node's");
  }
  CHECK(l.grad().numel() == 1);
  CHECK(std::isfinite(l.grad().template item<double>()));
}

TEMPLATE_TEST_CASE("diff_attention: bad shapes and dtypes throw kiln::Error naming the op and shapes", "[attention][diff][errors]",
                   KILN_BACKEND_TYPES) {
  using T = Tensor<TestType>;
  const T q = T::randn({1, 2, 2, 5, 8}), k = T::randn({1, 1, 2, 6, 8}), v = T::randn({1, 1, 6, 16}), l = T::scalar(0.5);
  CHECK_THROWS_WITH(fused::diff_attention_forward(T::randn({1, 2, 5, 8}), k, v, l, 1.0, true, 0),
                    Catch::Contains("diff_attention_forward") && Catch::Contains("[1, 2, 5, 8]"));
  CHECK_THROWS_WITH(fused::diff_attention_forward(T::randn({1, 2, 3, 5, 8}), k, v, l, 1.0, true, 0),
                    Catch::Contains("[B, H, 2, T, d]") && Catch::Contains("[1, 2, 3, 5, 8]"));
  CHECK_THROWS_WITH(fused::diff_attention_forward(q, k, v, T::ones({2}), 1.0, true, 0),
                    Catch::Contains("lambda") && Catch::Contains("[2]"));
  CHECK_THROWS_WITH(fused::diff_attention_forward(q, k, v, T::scalar(0.5, DType::f64), 1.0, true, 0), Catch::Contains("lambda"));
  CHECK_THROWS_WITH(fused::diff_attention_forward(q, T::randn({1, 1, 2, 6, 7}), v, l, 1.0, true, 0), Catch::Contains("do not fit"));
  CHECK_THROWS_WITH(fused::diff_attention_forward(q, k, T::randn({1, 1, 5, 16}), l, 1.0, true, 0),
                    Catch::Contains("diff_attention_forward") && Catch::Contains("[1, 1, 5, 16]"));
  auto [o, o2, l1, l2] = fused::diff_attention_forward(q, k, v, l, 1.0, true, 0);
  CHECK_THROWS_WITH(fused::diff_attention_backward(q, k, v, l, o, o2, l1, l2, T::randn({1, 2, 5, 8}), 1.0, true, 0),
                    Catch::Contains("diff_attention_backward") && Catch::Contains("[1, 2, 5, 8]"));
  CHECK_THROWS_AS(nn::diff_attention(Var<TestType>(T::randn({2, 2, 5, 8})), Var<TestType>(k), Var<TestType>(v), Var<TestType>(l), true, 0),
                  kiln::Error);
}

// ------------------------------------------------- differential attention with the head-wise norm
// nn::diff_attention_norm (core/fused_diff_attention.hpp: on Cpu the norm and the (1 − λ_init) scale in
// the fused op's epilogue, its backward in the kernel's row pass; the composite elsewhere) against the
// unfused form diff_attention → rms_norm → scale, in the same dtype: Y, dq, dk, dv, dλ and the norm
// weight's gradient, with and without a weight. Both sides run the same attention kernels, so the
// difference is the epilogue's rounding: a few ulps of the norm's output (|Y| ~ |w|·c·√dv at most).
namespace {

struct DiffNormResult {
  std::vector<double> y, dq, dk, dv, dlam, dw;
};

template <Backend B>
DiffNormResult run_diff_norm(const Inputs<B>& in, const Case& c, double lam, bool affine, double c_out, DType dt, bool fused) {
  Var<B> q(in.q.to(dt), true), k(in.k.to(dt), true), v(in.v.to(dt), true), l(Tensor<B>::scalar(lam, dt), true);
  Generator gen(c.T * 131 + c.dv);
  Var<B> w = affine ? Var<B>(Tensor<B>::rand({c.dv}, DType::f32, &gen).add(0.5).to(dt), true) : Var<B>();
  const Tensor<B> mask = in.mask.defined() && in.mask.dtype() != DType::boolean ? in.mask.to(dt) : in.mask;
  const double eps = 1e-5;
  Var<B> y;
  if (fused) {
    y = nn::diff_attention_norm(q, k, v, l, w, eps, c_out, c.causal, c.pos0, in.kp, mask);
    CHECK(std::string(y.grad_fn()) == "diff_attention_norm");
  } else {
    y = nn::functional::rms_norm(nn::diff_attention(q, k, v, l, c.causal, c.pos0, in.kp, mask), w, eps).mul(c_out);
  }
  y.backward(in.dout.to(dt));
  return {kt::host(y.value()), kt::host(q.grad()), kt::host(k.grad()),
          kt::host(v.grad()),  kt::host(l.grad()), affine ? kt::host(w.grad()) : std::vector<double>{}};
}

template <Backend B> void check_diff_norm_case(const Case& c, DType dt, uint64_t seed, double lam, bool affine) {
  INFO(c.str() << " dtype " << dtype_name(dt) << " lambda " << lam << " affine " << affine);
  const Inputs<B> in = make_diff_inputs<B>(c, dt, seed).second;
  const double c_out = 0.65;
  const DiffNormResult got = run_diff_norm(in, c, lam, affine, c_out, dt, true);
  const DiffNormResult want = run_diff_norm(in, c, lam, affine, c_out, dt, false);
  // ulps of the compute dtype times the reductions' lengths (the norm's dv, the attention's S and d)
  const double u = kt::u_acc(dt) * static_cast<double>(4 * (c.dv + c.d + c.S));
  auto tol = [&](const std::vector<double>& w) { return kt::Tol{0.0, u * std::max(1.0, max_abs(w))}; };
  compare(got.y, want.y, tol(want.y), "Y");
  compare(got.dq, want.dq, tol(want.dq), "dq (both branches)");
  compare(got.dk, want.dk, tol(want.dk), "dk (both branches)");
  compare(got.dv, want.dv, tol(want.dv), "dv");
  const double rows = static_cast<double>(c.B * c.H * c.T);
  compare(got.dlam, want.dlam, kt::Tol{0.0, rows * tol(want.dlam).atol}, "dλ");
  if (affine) compare(got.dw, want.dw, kt::Tol{0.0, rows * tol(want.dw).atol}, "dw (the norm's weight)");
}

}  // namespace

TEMPLATE_TEST_CASE("diff_attention_norm: fused norm epilogue matches diff_attention, rms_norm and the scale", "[attention][diff]",
                   KILN_BACKEND_TYPES) {
  uint64_t seed = 500;
  double lam = 0.8;
  bool affine = true;
  for (DType dt : {DType::f64, DType::f32}) {
    for (const Case& c : diff_cases()) {
      check_diff_norm_case<TestType>(c, dt, seed++, lam, affine);
      lam = -0.6 * lam + 0.1;
      affine = !affine;
    }
  }
}

TEMPLATE_TEST_CASE("diff_attention_norm: gradcheck in q, k, v, lambda and the norm weight (f64 finite differences)", "[attention][diff]",
                   KILN_BACKEND_TYPES) {
  Generator gen(37);
  using T = Tensor<TestType>;
  T kp = T::ones({2, 7}, DType::boolean);
  kp.narrow(1, 3, 1).fill_(0);
  for (bool causal : {true, false}) {
    INFO("causal " << causal);
    const auto r = gradcheck<TestType>(
        [&](const std::vector<Var<TestType>>& x) {
          return nn::diff_attention_norm(x[0], x[1], x[2], x[3], x[4], 1e-5, 0.7, causal, 2, kp);
        },
        {T::randn({2, 5, 4, 2, 3}, DType::f64, &gen).permute({0, 2, 3, 1, 4}), T::randn({2, 2, 2, 7, 3}, DType::f64, &gen),
         T::randn({2, 2, 7, 6}, DType::f64, &gen), T::scalar(0.3, DType::f64), T::rand({6}, DType::f64, &gen).add(0.5)});
    INFO(r.message);
    CHECK(r.ok);
  }
  // without a weight
  const auto r = gradcheck<TestType>(
      [&](const std::vector<Var<TestType>>& x) {
        return nn::diff_attention_norm(x[0], x[1], x[2], x[3], Var<TestType>(), 1e-5, 0.4, true, 0);
      },
      {T::randn({1, 2, 2, 6, 4}, DType::f64, &gen), T::randn({1, 1, 2, 6, 4}, DType::f64, &gen), T::randn({1, 1, 6, 8}, DType::f64, &gen),
       T::scalar(-0.2, DType::f64)});
  INFO(r.message);
  CHECK(r.ok);
}

TEMPLATE_TEST_CASE("diff_attention_norm: the output is a [B, T, H, dv] block and the node saves no T x S map", "[attention][diff]",
                   KILN_BACKEND_TYPES) {
  using T = Tensor<TestType>;
  Generator gen(43);
  Var<TestType> q(T::randn({2, 9, 3, 2, 4}, DType::f32, &gen).permute({0, 2, 3, 1, 4}), true);
  Var<TestType> k(T::randn({2, 9, 3, 2, 4}, DType::f32, &gen).permute({0, 2, 3, 1, 4}), true);
  Var<TestType> v(T::randn({2, 9, 3, 8}, DType::f32, &gen).transpose(1, 2), true), l(T::scalar(0.5), true);
  Var<TestType> w(T::ones({8}), true);
  const Var<TestType> y = nn::diff_attention_norm(q, k, v, l, w, 1e-5, 0.8, true, 0);
  const auto* saved = y.node()->backward.template target<autograd::DiffAttentionNormBackward<TestType>>();
  REQUIRE(saved != nullptr);
  for (const T& t : saved->saved())
    if (t.defined()) CHECK(t.numel() < 9 * 9 * 3 * 2);  // nothing of size T·S per head
  if constexpr (std::is_same_v<TestType, Cpu>) {
    CHECK(y.value().transpose(1, 2).is_contiguous());  // the head merge is a view
    const Var<TestType> merged = y.transpose(1, 2).reshape({2, 9, 24});
    CHECK(merged.value().storage() == y.value().storage());
  }
  const autograd::DiffAttentionNormBackward<TestType> node = *saved;      // (backward frees the closure)
  const T dy = T::randn({2, 9, 3, 8}, DType::f32, &gen).transpose(1, 2);  // as the head merge's backward gives it
  y.backward(dy);
  for (const Var<TestType>* x : {&q, &k, &v, &l, &w}) {
    REQUIRE(x->grad().defined());
    CHECK(std::isfinite(x->grad().abs().sum().template item<double>()));
  }
  if constexpr (std::is_same_v<TestType, Cpu>) {  // dq, dk come back in the projections' layout
    auto [dq, dk, dv, dlam, dw] = fused::diff_attention_norm_backward(node.q, node.k, node.v, node.lam, node.w, node.o, node.o2, node.lse1,
                                                                      node.lse2, node.rstd, dy, node.c, node.scale, true, 0);
    CHECK(dq.permute({0, 3, 1, 2, 4}).is_contiguous());
    CHECK(dk.permute({0, 3, 1, 2, 4}).is_contiguous());
    compare(kt::host(dq), kt::host(q.grad()), {0.0, 0.0}, "dq as the node's");
    compare(kt::host(dw), kt::host(w.grad()), {0.0, 0.0}, "dw as the node's");
  }
}

TEMPLATE_TEST_CASE("diff_attention_norm: bad weights, eps and scales throw kiln::Error naming the op", "[attention][diff][errors]",
                   KILN_BACKEND_TYPES) {
  using T = Tensor<TestType>;
  const T q = T::randn({1, 2, 2, 5, 8}), k = T::randn({1, 1, 2, 6, 8}), v = T::randn({1, 1, 6, 16}), l = T::scalar(0.5);
  CHECK_THROWS_WITH(fused::diff_attention_norm_forward(q, k, v, l, T::ones({8}), 1e-5, 0.8, 1.0, true, 0),
                    Catch::Contains("diff_attention_norm_forward") && Catch::Contains("[8]") && Catch::Contains("16"));
  CHECK_THROWS_WITH(fused::diff_attention_norm_forward(q, k, v, l, T::ones({16}, DType::f64), 1e-5, 0.8, 1.0, true, 0),
                    Catch::Contains("diff_attention_norm_forward") && Catch::Contains("f64"));
  CHECK_THROWS_WITH(fused::diff_attention_norm_forward(q, k, v, l, T(), -1.0, 0.8, 1.0, true, 0), Catch::Contains("eps"));
  CHECK_THROWS_WITH(fused::diff_attention_norm_forward(q, k, v, l, T(), 1e-5, INFINITY, 1.0, true, 0), Catch::Contains("scale"));
  CHECK_THROWS_WITH(fused::diff_attention_norm_forward(T::randn({1, 2, 5, 8}), k, v, l, T(), 1e-5, 0.8, 1.0, true, 0),
                    Catch::Contains("diff_attention_norm_forward") && Catch::Contains("[1, 2, 5, 8]"));
  auto [y, o, o2, l1, l2, r] = fused::diff_attention_norm_forward(q, k, v, l, T(), 1e-5, 0.8, 1.0, true, 0);
  CHECK_THROWS_WITH(fused::diff_attention_norm_backward(q, k, v, l, T(), o, o2, l1, l2, T::ones({1, 2}), y, 0.8, 1.0, true, 0),
                    Catch::Contains("diff_attention_norm_backward") && Catch::Contains("rstd"));
  CHECK_THROWS_WITH(fused::diff_attention_norm_backward(q, k, v, l, T(), o, o2, l1, l2, r, T::randn({1, 2, 5, 8}), 0.8, 1.0, true, 0),
                    Catch::Contains("diff_attention_norm_backward") && Catch::Contains("[1, 2, 5, 8]"));
}

// DifferentialAttention runs its norm in the fused op; the module's output and every parameter's
// gradient equal the unfused sublayer (diff_attention → subln → (1 − λ_init) → out_proj) built from the
// same parameters, with the parameter names of docs/specs.md, subln affine or not.
TEMPLATE_TEST_CASE("diff_attention_norm: DifferentialAttention equals its unfused sublayer, names unchanged", "[attention][diff]",
                   KILN_BACKEND_TYPES) {
  using T = Tensor<TestType>;
  for (bool affine : {false, true}) {
    INFO("diff_subln_affine " << affine);
    manual_seed(11);
    nn::DifferentialAttention<TestType> m({.d_model = 32, .n_heads = 2, .n_kv_heads = 1, .depth = 2, .subln_affine = affine});
    Generator gen(5);
    if (affine) {
      T w = m.parameter("subln.weight").value();
      w.copy_(T::rand({16}, DType::f32, &gen).add(0.5));
    }
    std::vector<std::string> names;
    for (auto& [n, p] : m.named_parameters()) names.push_back(n);
    std::vector<std::string> want{"lambda_q1",     "lambda_k1",     "lambda_q2",     "lambda_k2",
                                  "q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight"};
    if (affine) want.push_back("subln.weight");
    CHECK(names == want);
    const T x = T::randn({2, 7, 32}, DType::f32, &gen), dy = T::randn({2, 7, 32}, DType::f32, &gen);
    auto grads = [&]() {
      std::vector<std::vector<double>> g;
      for (auto& [n, p] : m.named_parameters()) {
        g.push_back(kt::host(p.grad()));
        p.zero_grad();
      }
      return g;
    };
    const Var<TestType> y = m.forward(Var<TestType>(x));
    y.backward(dy);
    const std::vector<std::vector<double>> got = grads();
    // the unfused sublayer from the module's own parameters (RoPE as the module applies it)
    const int64_t d = 8;
    Var<TestType> q = m.parameter("q_proj.weight"), k = m.parameter("k_proj.weight"), v = m.parameter("v_proj.weight");
    Var<TestType> xq = Var<TestType>(x).matmul(q.t()).view({2, 7, 2, 2, d}).permute({0, 2, 3, 1, 4});
    Var<TestType> xk = Var<TestType>(x).matmul(k.t()).view({2, 7, 1, 2, d}).permute({0, 2, 3, 1, 4});
    Var<TestType> xv = Var<TestType>(x).matmul(v.t()).view({2, 7, 1, 2 * d}).transpose(1, 2);
    nn::RopeTable<TestType> rope;
    xq = nn::rope_at(xq, 0, T(), 10000.0, &rope);
    xk = nn::rope_at(xk, 0, T(), 10000.0, &rope);
    Var<TestType> o = nn::diff_attention(xq, xk, xv, m.lambda(), true, 0);
    o = nn::functional::rms_norm(o, affine ? m.parameter("subln.weight") : Var<TestType>(), 1e-5).mul(1.0 - m.lambda_init());
    const Var<TestType> y2 = o.transpose(1, 2).reshape({2, 7, 32}).matmul(m.parameter("out_proj.weight").t());
    y2.backward(dy);
    const std::vector<std::vector<double>> want_g = grads();
    compare(kt::host(y.value()), kt::host(y2.value()), {0.0, 2e-6 * std::max(1.0, max_abs(kt::host(y2.value())))}, "y");
    for (size_t i = 0; i < got.size(); ++i)
      compare(got[i], want_g[i], {0.0, 1e-5 * std::max(1.0, max_abs(want_g[i]))}, "grad of " + names[i]);
  }
}
