// Reference backend: every element addressed through its logical index (Layout::offset_of), float
// dtypes computed and accumulated in double. Deliberately simple; see reference.hpp.
#include "kiln/backends/reference/reference.hpp"

#include <cmath>
#include <vector>

namespace kiln {
namespace {

using V = Reference::V;
using M = Reference::M;

// The type the oracle computes in: double for floats, the type itself otherwise.
template <class T> using ref_t = std::conditional_t<is_float_v<T>, double, T>;

template <class T> T load(const V& v, int64_t i) { return v.storage.as<T>()[v.layout.offset_of(i)]; }
template <class T> void store(const M& m, int64_t i, T x) { m.storage.as<T>()[m.layout.offset_of(i)] = x; }

template <class T, class U> T convert(U x) {
  if constexpr (std::is_same_v<T, U>)
    return x;  // exact (an i64 beyond 2^53 survives)
  else if constexpr (std::is_same_v<T, bool>)
    return static_cast<double>(x) != 0.0;
  else if constexpr (std::is_same_v<T, bf16> || std::is_same_v<T, f16>)
    return T(static_cast<float>(static_cast<double>(x)));
  else
    return static_cast<T>(static_cast<double>(x));
}

// Index of the element at `linear` (row-major in `shape`) with dim `axis` replaced by k.
std::vector<int64_t> unravel(int64_t linear, const Shape& shape) {
  std::vector<int64_t> idx(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    idx[d] = linear % shape[d];
    linear /= shape[d];
  }
  return idx;
}
int64_t offset_at(const Layout& l, const std::vector<int64_t>& idx) {
  int64_t off = l.offset;
  for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * l.strides[d];
  return off;
}

}  // namespace

void Reference::fill(M out, Scalar value) {
  visit_dtype(out.dtype, [&]<class T>(type_tag<T>) {
    const T x = value.to<T>();
    for (int64_t i = 0; i < out.layout.numel(); ++i) store<T>(out, i, x);
  });
}

void Reference::copy(M out, V in) {
  visit_dtype(in.dtype, [&]<class S>(type_tag<S>) {
    visit_dtype(out.dtype, [&]<class T>(type_tag<T>) {
      for (int64_t i = 0; i < out.layout.numel(); ++i) {
        const S x = load<S>(in, i);
        if constexpr (std::is_same_v<S, bool>)
          store<T>(out, i, convert<T>(x ? 1 : 0));
        else if constexpr (is_float_v<S>)
          store<T>(out, i, convert<T>(static_cast<double>(static_cast<compute_t<S>>(x))));
        else
          store<T>(out, i, convert<T>(x));
      }
    });
  });
}

template <class Op> void Reference::unary(M out, V in) {
  visit_dtype(in.dtype, [&]<class T>(type_tag<T>) {
    if constexpr (std::is_same_v<T, bool> || (Op::float_only && !is_float_v<T>)) {
      fail("{}: not supported for dtype {}", Op::name, in.dtype);
    } else {
      for (int64_t i = 0; i < out.layout.numel(); ++i) {
        const auto x = static_cast<ref_t<T>>(static_cast<compute_t<T>>(load<T>(in, i)));
        store<T>(out, i, convert<T>(Op::template f<ref_t<T>>(x)));
      }
    }
  });
}

template <class Op> void Reference::binary(M out, V a, V b) {
  visit_dtype(a.dtype, [&]<class T>(type_tag<T>) {
    if constexpr ((Op::float_only && !is_float_v<T>) || (!Op::compare && std::is_same_v<T, bool>)) {
      fail("{}: not supported for dtype {}", Op::name, a.dtype);
    } else {
      using R = ref_t<T>;
      for (int64_t i = 0; i < out.layout.numel(); ++i) {
        const auto x = static_cast<R>(static_cast<compute_t<T>>(load<T>(a, i)));
        const auto y = static_cast<R>(static_cast<compute_t<T>>(load<T>(b, i)));
        if constexpr (Op::compare)
          store<bool>(out, i, Op::template f<R>(x, y));
        else
          store<T>(out, i, convert<T>(Op::template f<R>(x, y)));
      }
    }
  });
}

void Reference::where(M out, V cond, V a, V b) {
  visit_dtype(a.dtype, [&]<class T>(type_tag<T>) {
    for (int64_t i = 0; i < out.layout.numel(); ++i) store<T>(out, i, load<bool>(cond, i) ? load<T>(a, i) : load<T>(b, i));
  });
}

template <class Op> void Reference::reduce(M out, V in, int axis) {
  const Shape& s = in.layout.shape;
  const int64_t n = s[static_cast<size_t>(axis)];
  visit_dtype(in.dtype, [&]<class T>(type_tag<T>) {
    if constexpr (std::is_same_v<T, bool>) {
      fail("{}: not supported for dtype bool", Op::name);
    } else {
      using R = ref_t<T>;
      for (int64_t o = 0; o < out.layout.numel(); ++o) {
        std::vector<int64_t> idx = unravel(o, out.layout.shape);
        if constexpr (Op::index) {
          R best = Op::template init<R>();
          int64_t at = 0;
          for (int64_t k = 0; k < n; ++k) {
            idx[static_cast<size_t>(axis)] = k;
            const auto x = static_cast<R>(static_cast<compute_t<T>>(in.storage.as<T>()[offset_at(in.layout, idx)]));
            if (k == 0 || Op::template better<R>(x, best)) {
              best = x;
              at = k;
            }
          }
          store<int64_t>(out, o, at);
        } else {
          R acc = Op::template init<R>();
          for (int64_t k = 0; k < n; ++k) {
            idx[static_cast<size_t>(axis)] = k;
            acc = Op::template step<R>(acc, static_cast<R>(static_cast<compute_t<T>>(in.storage.as<T>()[offset_at(in.layout, idx)])));
          }
          store<T>(out, o, convert<T>(acc));
        }
      }
    }
  });
}

void Reference::matmul(M out, V a, V b) {
  const Shape& os = out.layout.shape;
  const size_t r = os.size();
  const int64_t Mr = os[r - 2], N = os[r - 1], K = a.layout.shape[r - 1];
  visit_dtype(a.dtype, [&]<class T>(type_tag<T>) {
    if constexpr (!is_float_v<T>) {
      fail("matmul: not supported for dtype {}", a.dtype);
    } else {
      for (int64_t o = 0; o < out.layout.numel(); ++o) {
        std::vector<int64_t> idx = unravel(o, os);
        const int64_t i = idx[r - 2], j = idx[r - 1];
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) {
          idx[r - 2] = i;
          idx[r - 1] = k;
          const double x = static_cast<compute_t<T>>(a.storage.as<T>()[offset_at(a.layout, idx)]);
          idx[r - 2] = k;
          idx[r - 1] = j;
          const double y = static_cast<compute_t<T>>(b.storage.as<T>()[offset_at(b.layout, idx)]);
          acc += x * y;
        }
        store<T>(out, o, convert<T>(acc));
      }
    }
  });
  (void)Mr;
  (void)N;
}

namespace {
int64_t load_index(const V& index, int64_t i) {
  return index.dtype == DType::i64 ? load<int64_t>(index, i) : static_cast<int64_t>(load<int32_t>(index, i));
}
}  // namespace

void Reference::gather(M out, V src, int axis, V index) {
  visit_dtype(src.dtype, [&]<class T>(type_tag<T>) {
    for (int64_t o = 0; o < out.layout.numel(); ++o) {
      std::vector<int64_t> idx = unravel(o, out.layout.shape);
      if (!idx.empty()) idx[static_cast<size_t>(axis)] = load_index(index, o);
      store<T>(out, o, src.storage.as<T>()[offset_at(src.layout, idx)]);
    }
  });
}

void Reference::scatter_add(M out, int axis, V index, V src) {
  visit_dtype(src.dtype, [&]<class T>(type_tag<T>) {
    if constexpr (std::is_same_v<T, bool>) {
      fail("scatter_add: not supported for dtype bool");
    } else {
      for (int64_t i = 0; i < index.layout.numel(); ++i) {
        std::vector<int64_t> idx = unravel(i, index.layout.shape);
        const T x = src.storage.as<T>()[offset_at(src.layout, idx)];
        if (!idx.empty()) idx[static_cast<size_t>(axis)] = load_index(index, i);
        T& d = out.storage.as<T>()[offset_at(out.layout, idx)];
        d = convert<T>(static_cast<ref_t<T>>(static_cast<compute_t<T>>(d)) + static_cast<ref_t<T>>(static_cast<compute_t<T>>(x)));
      }
    }
  });
}

void Reference::rand_uniform(M out, uint64_t seed, uint64_t offset, double lo, double hi) {
  visit_dtype(out.dtype, [&]<class T>(type_tag<T>) {
    for (int64_t i = 0; i < out.layout.numel(); ++i) {
      const double x = philox_affine(lo, hi - lo, philox_uniform_at(seed, offset, static_cast<uint64_t>(i)));
      if constexpr (is_float_v<T>)
        store<T>(out, i, round_uniform<T>(x, hi));
      else
        store<T>(out, i, convert<T>(x));
    }
  });
}

void Reference::rand_normal(M out, uint64_t seed, uint64_t offset, double mean, double std) {
  visit_dtype(out.dtype, [&]<class T>(type_tag<T>) {
    for (int64_t i = 0; i < out.layout.numel(); ++i)
      store<T>(out, i, convert<T>(philox_affine(mean, std, philox_normal_at(seed, offset, static_cast<uint64_t>(i)))));
  });
}

#define KILN_INST_UNARY(OP) template void Reference::unary<op::OP>(M, V);
#define KILN_INST_BINARY(OP) template void Reference::binary<op::OP>(M, V, V);
#define KILN_INST_REDUCE(OP) template void Reference::reduce<op::OP>(M, V, int);
KILN_UNARY_OPS(KILN_INST_UNARY)
KILN_BINARY_OPS(KILN_INST_BINARY)
KILN_REDUCE_OPS(KILN_INST_REDUCE)
KILN_INDEX_REDUCE_OPS(KILN_INST_REDUCE)
#undef KILN_INST_UNARY
#undef KILN_INST_BINARY
#undef KILN_INST_REDUCE

}  // namespace kiln
