// reduce<Op> along one axis. Three shapes of work, each a kernel with variants per instruction set
// (common.hpp):
//  * rows: the reduced axis has unit stride: each output folds one contiguous row (AVX2 for f32
//    sum/max/min); parallel over outputs, or over pieces of the row when there are fewer outputs than
//    threads;
//  * columns: the innermost output dim has unit stride in both input and output (e.g. summing [N, D]
//    over N): accumulate whole rows of the input into a block of accumulators (vectorises);
//  * otherwise one strided fold per output.
// Accumulators: double for sum/prod of float types (Reference accumulates in double too), the compute
// type for max/min (exact), the element type for integers.
#include <vector>

#include "kiln/backends/checks.hpp"
#include "kiln/backends/cpu/common.hpp"
#include "kiln/backends/cpu/vecmath.hpp"

namespace kiln {
using namespace cpu;

namespace {

template <class Op, class T> using acc_t =
    std::conditional_t<(std::is_same_v<Op, op::Sum> || std::is_same_v<Op, op::Prod>)&&is_float_v<T>, double, compute_t<T>>;

// ---------------------------------------------------------------------------------- value folds
// f32 sum (in double) / max / min of a contiguous run, AVX2.
#if KILN_CPU_X86
KILN_CPU_AVX2_BEGIN
template <class Op, class A> A fold_f32(Avx2, const float* x, int64_t n, A acc) {
  if constexpr (std::is_same_v<Op, op::Sum>) {
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd(), s2 = _mm256_setzero_pd(), s3 = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
      s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(a)));
      s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)));
      s2 = _mm256_add_pd(s2, _mm256_cvtps_pd(_mm256_castps256_ps128(b)));
      s3 = _mm256_add_pd(s3, _mm256_cvtps_pd(_mm256_extractf128_ps(b, 1)));
    }
    acc += vm::avx2::hsum4d(_mm256_add_pd(_mm256_add_pd(s0, s1), _mm256_add_pd(s2, s3)));
    for (; i < n; ++i) acc += static_cast<double>(x[i]);
    return acc;
  } else {
    constexpr bool is_max = std::is_same_v<Op, op::Max>;
    __m256 m0 = _mm256_set1_ps(acc), m1 = m0, nan = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
      const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
      m0 = is_max ? _mm256_max_ps(a, m0) : _mm256_min_ps(a, m0);
      m1 = is_max ? _mm256_max_ps(b, m1) : _mm256_min_ps(b, m1);
    }
    if (!_mm256_testz_ps(nan, nan)) return std::numeric_limits<float>::quiet_NaN();
    alignas(32) float l[16];
    _mm256_store_ps(l, m0);
    _mm256_store_ps(l + 8, m1);
    for (float v : l) acc = Op::template step<A>(acc, v);
    for (; i < n; ++i) acc = Op::template step<A>(acc, static_cast<A>(x[i]));
    return acc;
  }
}
KILN_CPU_AVX2_END
#endif

template <class I, class Op, class T, class A> A fold(const T* x, int64_t n, int64_t s, A acc) {
  if (s == 1) {
    if constexpr (!std::is_same_v<I, Baseline> && std::is_same_v<T, float> &&
                  (std::is_same_v<Op, op::Sum> || std::is_same_v<Op, op::Max> || std::is_same_v<Op, op::Min>)) {
      return fold_f32<Op, A>(I{}, x, n, acc);
    }
    for (int64_t i = 0; i < n; ++i) acc = Op::template step<A>(acc, static_cast<A>(ld(x[i])));
    return acc;
  }
  for (int64_t i = 0; i < n; ++i) acc = Op::template step<A>(acc, static_cast<A>(ld(x[i * s])));
  return acc;
}

// Combining partial folds of consecutive pieces.
template <class Op, class A> A combine(A a, A b) {
  if constexpr (std::is_same_v<Op, op::Sum>)
    return a + b;
  else if constexpr (std::is_same_v<Op, op::Prod>)
    return a * b;
  else
    return Op::template step<A>(a, b);
}

// ---------------------------------------------------------------------------------- index folds
template <class A> struct Best {
  A v;
  int64_t at;
};
// Reference's loop: the first element, then strictly better ones.
template <class Op, class T, class A> Best<A> arg_fold(const T* x, int64_t n, int64_t s, int64_t k0) {
  Best<A> b{static_cast<A>(ld(x[0])), k0};
  for (int64_t i = 1; i < n; ++i) {
    const A v = static_cast<A>(ld(x[i * s]));
    if (Op::template better<A>(v, b.v)) b = {v, k0 + i};
  }
  return b;
}

// ---------------------------------------------------------------------------------- kernels
// Kernels (common.hpp). The result of folding one row (or piece of a row starting at index k0).
template <class Op, class T> using fold_result_t = std::conditional_t<Op::index, Best<acc_t<Op, T>>, acc_t<Op, T>>;
template <class I, class Op, class T> fold_result_t<Op, T> fold_row(const T* row, int64_t len, int64_t sa, int64_t k0) {
  using A = acc_t<Op, T>;
  if constexpr (Op::index)
    return arg_fold<Op, T, A>(row, len, sa, k0);
  else
    return fold<I, Op, T, A>(row, len, sa, Op::template init<A>());
}

template <class Op, class T, class O> void store(O* o, fold_result_t<Op, T> r) {
  if constexpr (Op::index)
    *o = r.at;
  else
    *o = convert<T>(r);
}

// cnt outputs o[k * os], each the fold of n elements (stride sa) from x + k * xs.
template <class I, class Op, class T, class O>
void fold_rows(O* o, int64_t os, const T* x, int64_t xs, int64_t cnt, int64_t n, int64_t sa) {
  for (int64_t j = 0; j < cnt; ++j) store<Op, T>(o + j * os, fold_row<I, Op, T>(x + j * xs, n, sa, 0));
}

// w contiguous outputs o[j], each the fold over k < n of base[k * sa + j] (columns of a row-major block).
template <class I, class Op, class T, class O> void fold_columns(O* o, const T* base0, int64_t w, int64_t n, int64_t sa) {
  using A = acc_t<Op, T>;
  constexpr int64_t kBlk = 256;
  for (int64_t j0 = 0; j0 < w; j0 += kBlk) {
    const int64_t m = std::min(kBlk, w - j0);
    const T* base = base0 + j0;
    if constexpr (Op::index) {
      A bv[kBlk];
      int64_t bi[kBlk];
      for (int64_t j = 0; j < m; ++j) {
        bv[j] = static_cast<A>(ld(base[j]));
        bi[j] = 0;
      }
      for (int64_t k = 1; k < n; ++k) {
        const T* row = base + k * sa;
        for (int64_t j = 0; j < m; ++j) {
          const A v = static_cast<A>(ld(row[j]));
          if (Op::template better<A>(v, bv[j])) {
            bv[j] = v;
            bi[j] = k;
          }
        }
      }
      for (int64_t j = 0; j < m; ++j) o[j0 + j] = bi[j];
    } else {
      A acc[kBlk];
      for (int64_t j = 0; j < m; ++j) acc[j] = Op::template init<A>();
      for (int64_t k = 0; k < n; ++k) {
        const T* row = base + k * sa;
        for (int64_t j = 0; j < m; ++j) acc[j] = Op::template step<A>(acc[j], static_cast<A>(ld(row[j])));
      }
      for (int64_t j = 0; j < m; ++j) o[j0 + j] = convert<T>(acc[j]);
    }
  }
}

template <class Op, class T> void reduce_kernel(Cpu::M out, Cpu::V in, int axis) {
  using A = acc_t<Op, T>;
  using O = std::conditional_t<Op::index, int64_t, T>;
  using R = fold_result_t<Op, T>;
  const auto ax = static_cast<size_t>(axis);
  const int64_t n = in.layout.shape[ax];
  const int64_t sa = n == 1 ? 1 : in.layout.strides[ax];
  const Plan<2> p = make_plan<2>(out.layout.shape, {&out.layout.strides, &in.layout.strides}, {out.layout.offset, in.layout.offset});
  O* o = out.storage.as<O>();
  const T* x = in.storage.as<T>();
  const int nt = num_threads();

  // Few outputs, long rows: split each row over the threads.
  if (p.numel < nt && n >= 2 * kGrainCheap) {
    const auto fold_piece = pick_if<avx2_dtype_v<T>, fold_row<Baseline, Op, T>, fold_row<Avx2, Op, T>>();
    const int parts = nt;
    std::vector<R> partial(static_cast<size_t>(parts));
    for_range(p, 0, p.numel, [&](const std::array<int64_t, 2>& off0, int64_t cnt) {
      for (int64_t j = 0; j < cnt; ++j) {
        const int64_t oo = off0[0] + j * p.inner(0), io = off0[1] + j * p.inner(1);
        const int64_t piece = (n + parts - 1) / parts;
        parallel_for(parts, 1, [&](int64_t b, int64_t e) {
          for (int64_t q = b; q < e; ++q) {
            const int64_t k0 = std::min(n, q * piece), k1 = std::min(n, k0 + piece);
            if (k1 > k0) partial[static_cast<size_t>(q)] = fold_piece(x + io + k0 * sa, k1 - k0, sa, k0);
          }
        });
        R r = partial[0];
        for (int q = 1; q < parts && q * piece < n; ++q) {
          const R& c = partial[static_cast<size_t>(q)];
          if constexpr (Op::index) {
            if (Op::template better<A>(c.v, r.v)) r = c;
          } else {
            r = combine<Op, A>(r, c);
          }
        }
        store<Op, T>(o + oo, r);
      }
    });
    return;
  }

  // Columns: contiguous inner output dim over contiguous input.
  if (sa != 1 && p.inner(0) == 1 && p.inner(1) == 1 && p.size[0] > 1) {
    const auto columns = pick_if<avx2_dtype_v<T>, fold_columns<Baseline, Op, T, O>, fold_columns<Avx2, Op, T, O>>();
    const int64_t grain = std::max<int64_t>(1, kGrainCheap / n);
    for_each_parallel(p, grain, [&](const std::array<int64_t, 2>& off, int64_t w) { columns(o + off[0], x + off[1], w, n, sa); });
    return;
  }

  // One fold per output (rows when sa == 1, strided otherwise).
  const auto rows = pick_if<avx2_dtype_v<T>, fold_rows<Baseline, Op, T, O>, fold_rows<Avx2, Op, T, O>>();  // integer folds: baseline
  const int64_t grain = std::max<int64_t>(1, kGrainCheap / n);
  for_each_parallel(
      p, grain, [&](const std::array<int64_t, 2>& off, int64_t cnt) { rows(o + off[0], p.inner(0), x + off[1], p.inner(1), cnt, n, sa); });
}

}  // namespace

template <class Op> void Cpu::reduce(M out, V in, int axis) {
  checks::reduce<Op>(out, in, axis);
  visit_dtype(in.dtype, [&]<class T>(type_tag<T>) {
    if constexpr (checks::reduce_supported_v<T>) reduce_kernel<Op, T>(out, in, axis);
  });
}

#define KILN_INST_REDUCE(OP) template void Cpu::reduce<op::OP>(M, V, int);
KILN_REDUCE_OPS(KILN_INST_REDUCE)
KILN_INDEX_REDUCE_OPS(KILN_INST_REDUCE)
#undef KILN_INST_REDUCE

}  // namespace kiln
