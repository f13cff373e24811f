#pragma once
// Shared helpers for the conformance, error and parity suites (header-only: every folder under tests/
// with .cpp files becomes an executable, this one has none).
//
//  * KILN_TEST_BACKENDS: the backends compared against Reference. Adding a backend is one type here.
//  * Gen: a seeded generator of shapes, values and layouts (contiguous, transposed, stepped slice,
//    narrowed, expanded with stride 0) that a test draws from.
//  * check_close / check_equal: element-by-element comparison that reports the first mismatching
//    multi-index with both values, and how many elements mismatched.
//  * Tolerances: unit roundoffs per dtype; see the comment at `Tol`.
//  * error_of: the message of the kiln::Error a function throws.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <kiln/backends/backends.hpp>
#include <kiln/backends/cpu/cpu.hpp>
#include <kiln/backends/reference/reference.hpp>
#include <kiln/core/error.hpp>
#include <kiln/core/tensor.hpp>

#if defined(KILN_HAVE_CUDA_BACKEND)
#include <kiln/backends/cuda/cuda.hpp>
#define KILN_TEST_BACKENDS ::kiln::Cpu, ::kiln::Cuda
#else
#define KILN_TEST_BACKENDS ::kiln::Cpu
#endif

namespace kt {

using kiln::DType;
using kiln::Scalar;
using kiln::Shape;
using Ref = kiln::Reference;
using RT = kiln::Tensor<Ref>;

inline const std::vector<DType> kFloatDTypes{DType::f32, DType::f64, DType::bf16, DType::f16};
inline const std::vector<DType> kAllDTypes{DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::boolean};

// ------------------------------------------------------------------------------------ tolerances
// Tolerances are derived from unit roundoffs, never tuned to make a test pass.
//  * u_store(d): half an ulp at 1 of the storage type. Two backends that compute nearly the same real
//    number and round it to d may still land on neighbouring values, so |a-b| <= 2 u_store |b|.
//  * u_acc(d): roundoff of the arithmetic a fast backend uses: f64 for f64, f32 for everything else
//    (bf16/f16 compute in f32, DESIGN.md §2).
//  * Elementwise f32: vectorised exp/log/tanh/erf approximations are within a few ulp; we allow 8 ulp
//    (8 * 2^-23 = 9.5e-7, the "~1e-6 relative" of the brief) plus an absolute 1e-6 for results near a
//    zero of the function (sin near pi, expm1/log1p cancellation, gelu at large negative x) where
//    a few-ulp error in the argument becomes a large relative error.
//  * Sums: Higham's bound for any summation order, |err| <= (n-1) u sum|x_i|, per output element
//    (computed from the inputs with Reference), plus the storage rounding of the result.
//  * matmul: |err_ij| <= K u (|A||B|)_ij, plus storage rounding.
inline double u_store(DType d) {
  switch (d) {
    case DType::f32:
      return 0x1p-24;
    case DType::f64:
      return 0x1p-53;
    case DType::bf16:
      return 0x1p-9;
    case DType::f16:
      return 0x1p-11;
    default:
      return 0.0;  // integers and bool: exact
  }
}
inline double u_acc(DType d) { return d == DType::f64 ? 0x1p-53 : kiln::is_floating(d) ? 0x1p-24 : 0.0; }

struct Tol {
  double rtol = 0, atol = 0;
};
// Elementwise ops (unary, binary): see above.
inline Tol elementwise_tol(DType d) {
  switch (d) {
    case DType::f32:
      return {8 * 0x1p-23, 1e-6};
    case DType::f64:
      return {64 * 0x1p-52, 1e-14};
    // the f32 result (within f32 tolerance) rounded to bf16/f16: at most one storage ulp apart
    case DType::bf16:
      return {2 * 0x1p-8 + 1e-6, 1e-6};
    case DType::f16:
      return {2 * 0x1p-11 + 1e-6, 1e-6};
    default:
      return {0, 0};
  }
}

// ------------------------------------------------------------------------------------ host views
template <kiln::Backend B> std::vector<double> host(const kiln::Tensor<B>& t) { return t.template to_vector<double>(); }

inline std::string index_str(int64_t linear, const Shape& s) {
  std::vector<int64_t> idx(s.size());
  for (size_t d = s.size(); d-- > 0;) {
    idx[d] = s[d] ? linear % s[d] : 0;
    linear = s[d] ? linear / s[d] : 0;
  }
  return fmt::format("[{}]", fmt::join(idx, ", "));
}

// Compares got with want element by element: |g - w| <= atol + rtol |w| (+ bound[i] when given);
// NaN matches NaN, inf matches the same inf. Shapes and dtypes must be equal. One CHECK per call,
// with the first mismatch (index and both values) and the count in its message.
template <kiln::Backend B1, kiln::Backend B2> void check_close(const kiln::Tensor<B1>& got, const kiln::Tensor<B2>& want, Tol tol,
                                                               const std::string& what, const std::vector<double>* bound = nullptr) {
  INFO(what);
  REQUIRE(got.defined());
  REQUIRE(want.defined());
  INFO("got shape " << kiln::shape_str(got.shape()) << " want " << kiln::shape_str(want.shape()));
  REQUIRE(got.shape() == want.shape());
  INFO("got dtype " << kiln::dtype_name(got.dtype()) << " want " << kiln::dtype_name(want.dtype()));
  REQUIRE(got.dtype() == want.dtype());
  const std::vector<double> g = host(got), w = host(want);
  REQUIRE(g.size() == w.size());
  if (bound) REQUIRE(bound->size() == w.size());
  int64_t bad = 0, first = -1;
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double a = g[i], b = w[i];
    bool ok;
    if (std::isnan(b) || std::isnan(a))
      ok = std::isnan(a) && std::isnan(b);
    else if (std::isinf(b) || std::isinf(a))
      ok = a == b;
    else {
      const double lim = tol.atol + tol.rtol * std::abs(b) + (bound ? (*bound)[i] : 0.0);
      const double err = std::abs(a - b);
      ok = err <= lim;
      if (lim > 0) worst = std::max(worst, err / lim);
    }
    if (!ok) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  }
  if (bad) {
    const auto f = static_cast<size_t>(first);
    FAIL_CHECK(fmt::format("{} of {} elements differ; first at {}: got {:.9g}, want {:.9g} (rtol {:.3g}, atol {:.3g}{})", bad, g.size(),
                           index_str(first, want.shape()), g[f], w[f], tol.rtol, tol.atol,
                           bound ? fmt::format(", bound {:.3g}", (*bound)[f]) : std::string()));
  } else {
    SUCCEED("close (worst err/limit " << worst << ")");
  }
}

template <kiln::Backend B1, kiln::Backend B2>
void check_equal(const kiln::Tensor<B1>& got, const kiln::Tensor<B2>& want, const std::string& what) {
  check_close(got, want, Tol{0, 0}, what);
}

// Bit-level equality (f32/f64/bf16/f16 payloads compared as bytes): for RNG and copies.
template <kiln::Backend B1, kiln::Backend B2>
void check_bits(const kiln::Tensor<B1>& got, const kiln::Tensor<B2>& want, const std::string& what) {
  INFO(what);
  REQUIRE(got.shape() == want.shape());
  REQUIRE(got.dtype() == want.dtype());
  const auto a = got.contiguous(), b = want.contiguous();
  const size_t n = static_cast<size_t>(a.numel()) * kiln::dtype_size(a.dtype());
  std::vector<unsigned char> x(n), y(n);
  if (n) {
    a.copy_to_host(x.data(), n);
    b.copy_to_host(y.data(), n);
  }
  const size_t es = kiln::dtype_size(a.dtype());
  for (size_t i = 0; i < n; ++i)
    if (x[i] != y[i]) {
      const std::vector<double> g = host(got), w = host(want);
      FAIL_CHECK(fmt::format("bits differ first at element {}: got {:.9g}, want {:.9g}",
                             index_str(static_cast<int64_t>(i / es), want.shape()), g[i / es], w[i / es]));
      return;
    }
  SUCCEED();
}

// ------------------------------------------------------------------------------------ random inputs
enum class Lay { contiguous, transposed, stepped, narrowed, expanded, permuted };
inline const char* layout_name(Lay l) {
  switch (l) {
    case Lay::contiguous:
      return "contiguous";
    case Lay::transposed:
      return "transposed";
    case Lay::stepped:
      return "stepped slice";
    case Lay::narrowed:
      return "narrowed";
    case Lay::expanded:
      return "expanded";
    case Lay::permuted:
      return "permuted";
  }
  return "?";
}
inline const std::vector<Lay> kLayouts{Lay::contiguous, Lay::transposed, Lay::stepped, Lay::narrowed, Lay::expanded, Lay::permuted};

struct Gen {
  std::mt19937_64 rng;
  explicit Gen(uint64_t seed) : rng(seed) {}

  int64_t integer(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); }
  double real(double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); }
  bool coin(double p = 0.5) { return std::bernoulli_distribution(p)(rng); }
  template <class T> const T& pick(const std::vector<T>& v) {
    return v[static_cast<size_t>(integer(0, static_cast<int64_t>(v.size()) - 1))];
  }

  // A shape of rank in [lo_rank, hi_rank] with dims mostly in [1, max_dim], sometimes 1 or 0.
  Shape shape(int lo_rank = 0, int hi_rank = 4, int64_t max_dim = 6, double p_zero = 0.05) {
    const int r = static_cast<int>(integer(lo_rank, hi_rank));
    Shape s(static_cast<size_t>(r));
    for (auto& d : s) {
      const double p = real(0, 1);
      d = p < p_zero ? 0 : p < p_zero + 0.15 ? 1 : integer(1, max_dim);
    }
    return s;
  }

  // Options for values(): a fraction of NaNs (floats), integral values (ties for max/argmax).
  double p_nan = 0;
  bool ties = false;

  // Host values for dtype d, in [lo, hi] for floats (rounded to d), small integers for ints.
  std::vector<double> values(int64_t n, DType d, double lo = -3, double hi = 3) {
    std::vector<double> v(static_cast<size_t>(n));
    for (auto& x : v) {
      if (d == DType::boolean)
        x = coin() ? 1 : 0;
      else if (kiln::is_integral(d) || ties)
        x = static_cast<double>(integer(static_cast<int64_t>(std::ceil(lo)), static_cast<int64_t>(std::floor(hi))));
      else
        x = real(lo, hi);
      if (p_nan > 0 && kiln::is_floating(d) && coin(p_nan)) x = std::nan("");
    }
    return v;
  }

  // A contiguous tensor of `shape` and dtype `d` on B with the given host values (converted by B).
  template <kiln::Backend B> kiln::Tensor<B> tensor_from(const std::vector<double>& v, const Shape& shape, DType d) {
    return kiln::Tensor<B>::from_vector(v, shape).to(d);
  }

  // A tensor of logical shape `shape` laid out as `layout` (values in [lo, hi]); the same values and
  // layout on Reference (ref) and on B (out). Non-contiguous layouts are views into a larger base.
  template <kiln::Backend B>
  void make_pair(const Shape& shape, DType d, Lay layout, RT& ref, kiln::Tensor<B>& out, double lo = -3, double hi = 3) {
    const int64_t r = static_cast<int64_t>(shape.size());
    auto build = [&](const Shape& base_shape, auto&& view) {
      const std::vector<double> v = values(kiln::numel(base_shape), d, lo, hi);
      ref = view(tensor_from<Ref>(v, base_shape, d));
      out = view(tensor_from<B>(v, base_shape, d));
    };
    if (layout == Lay::contiguous || r == 0) {
      build(shape, [](auto t) { return t; });
    } else if (layout == Lay::transposed && r >= 2) {
      Shape b = shape;
      std::swap(b[0], b[static_cast<size_t>(r - 1)]);
      build(b, [r](auto t) { return t.transpose(0, r - 1); });
    } else if (layout == Lay::permuted && r >= 2) {
      // reverse the axes: base has the reversed shape
      Shape b(shape.rbegin(), shape.rend());
      std::vector<int64_t> p(static_cast<size_t>(r));
      for (int64_t i = 0; i < r; ++i) p[static_cast<size_t>(i)] = r - 1 - i;
      build(b, [p](auto t) { return t.permute(p); });
    } else if (layout == Lay::stepped) {
      // every axis: base twice as long (+1), take every 2nd element from 1
      Shape b = shape;
      for (auto& x : b) x = 2 * x + 1;
      build(b, [r](auto t) {
        for (int64_t a = 0; a < r; ++a) t = t.slice(a, 1, t.size(a), 2);
        return t;
      });
    } else if (layout == Lay::narrowed) {
      const int64_t ax = integer(0, r - 1);
      const int64_t extra = integer(1, 3), start = integer(0, extra);
      Shape b = shape;
      b[static_cast<size_t>(ax)] += extra;
      build(b, [ax, start, &shape](auto t) { return t.narrow(ax, start, shape[static_cast<size_t>(ax)]); });
    } else if (layout == Lay::expanded) {
      // a random subset of axes (and maybe a new leading one) broadcast with stride 0
      Shape b(shape.begin() + (coin(0.3) ? 1 : 0), shape.end());
      for (auto& x : b)
        if (coin()) x = 1;
      build(b, [&shape](auto t) { return t.expand(shape); });
    } else {
      build(shape, [](auto t) { return t; });
    }
    REQUIRE(ref.shape() == shape);
    REQUIRE(out.shape() == shape);
  }
};

// The description of an input for INFO().
inline std::string describe(const Shape& s, DType d, Lay l) {
  return fmt::format("{} {} {}", kiln::shape_str(s), kiln::dtype_name(d), layout_name(l));
}

// Two shapes that broadcast: b is a (possibly lower-rank) shape with some dims set to 1, and either
// operand may be the larger one.
inline std::pair<Shape, Shape> broadcast_pair(Gen& g, int max_rank = 4) {
  Shape a = g.shape(0, max_rank, 5);
  Shape b(a.begin() + g.integer(0, static_cast<int64_t>(a.size())), a.end());
  for (auto& x : b)
    if (g.coin(0.3)) x = 1;
  for (auto& x : a)
    if (g.coin(0.15)) x = 1;
  // where a has 1 and b doesn't, a broadcasts; where b has 1, b broadcasts
  if (g.coin()) std::swap(a, b);
  return {a, b};
}

// The message of the kiln::Error that f throws, "(no error)" when it throws none (any other exception
// goes through to Catch).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const kiln::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace kt
