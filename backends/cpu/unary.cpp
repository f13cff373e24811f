// unary<Op>: contiguous runs go straight to the array kernels; strided runs and the half types pass
// through a small float buffer so they use the same vector code. Each run goes to the kernel variant
// for the instruction set (common.hpp).
#include "kiln/backends/checks.hpp"
#include "kiln/backends/cpu/common.hpp"
#include "kiln/backends/cpu/vecmath.hpp"

namespace kiln {
using namespace cpu;

namespace {

template <class Op> constexpr bool is_math_v =
    std::is_same_v<Op, op::Exp> || std::is_same_v<Op, op::Log> || std::is_same_v<Op, op::Tanh> || std::is_same_v<Op, op::Sigmoid> ||
    std::is_same_v<Op, op::Silu> || std::is_same_v<Op, op::Gelu> || std::is_same_v<Op, op::GeluTanh> || std::is_same_v<Op, op::Log1p> ||
    std::is_same_v<Op, op::Expm1> || std::is_same_v<Op, op::Sin> || std::is_same_v<Op, op::Cos> || std::is_same_v<Op, op::Pow>;

// The ops with array functions in vecmath.hpp (and an Avx512 variant there).
template <class Op> constexpr bool is_vm_v = std::is_same_v<Op, op::Exp> || std::is_same_v<Op, op::Log> || std::is_same_v<Op, op::Tanh> ||
                                             std::is_same_v<Op, op::Sigmoid> || std::is_same_v<Op, op::Silu> ||
                                             std::is_same_v<Op, op::GeluTanh>;

// sqrt / rsqrt over n floats, AVX2.
#if KILN_CPU_X86
KILN_CPU_AVX2_BEGIN
template <class Op> void sqrt_n(Avx2, const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 r = _mm256_sqrt_ps(_mm256_loadu_ps(x + i));
    if constexpr (std::is_same_v<Op, op::Rsqrt>) r = _mm256_div_ps(_mm256_set1_ps(1.0f), r);
    _mm256_storeu_ps(y + i, r);
  }
  for (; i < n; ++i) y[i] = Op::template f<float>(x[i]);
}
KILN_CPU_AVX2_END
#endif

// y = Op(x) over n contiguous floats (x may equal y).
template <class I, class Op> void apply_f32(const float* x, float* y, int64_t n) {
  if constexpr (std::is_same_v<Op, op::Exp>)
    vm::exp_n(I{}, x, y, n);
  else if constexpr (std::is_same_v<Op, op::Log>)
    vm::log_n(I{}, x, y, n);
  else if constexpr (std::is_same_v<Op, op::Tanh>)
    vm::tanh_n(I{}, x, y, n);
  else if constexpr (std::is_same_v<Op, op::Sigmoid>)
    vm::sigmoid_n(I{}, x, y, n);
  else if constexpr (std::is_same_v<Op, op::Silu>)
    vm::silu_n(I{}, x, y, n);
  else if constexpr (std::is_same_v<Op, op::GeluTanh>)
    vm::gelu_tanh_n(I{}, x, y, n);
  else if constexpr (std::is_same_v<Op, op::Gelu>)
    for (int64_t i = 0; i < n; ++i) y[i] = vm::gelu_s(x[i]);
  else if constexpr (!std::is_same_v<I, Baseline> && (std::is_same_v<Op, op::Sqrt> || std::is_same_v<Op, op::Rsqrt>))
    sqrt_n<Op>(I{}, x, y, n);
  else
    for (int64_t i = 0; i < n; ++i) y[i] = Op::template f<float>(x[i]);
}

// Kernel (common.hpp): one run of n elements, d[i * so] = Op(s[i * si]).
template <class I, class Op, class T> void unary_run(T* d, const T* s, int64_t n, int64_t so, int64_t si) {
  if constexpr (std::is_same_v<compute_t<T>, float>) {
    if constexpr (std::is_same_v<T, float>) {
      if (so == 1 && si == 1) return apply_f32<I, Op>(s, d, n);
    }
    constexpr int64_t kBuf = 256;
    alignas(32) float buf[kBuf];
    for (int64_t i0 = 0; i0 < n; i0 += kBuf) {
      const int64_t m = std::min(kBuf, n - i0);
      for (int64_t i = 0; i < m; ++i) buf[i] = static_cast<float>(s[(i0 + i) * si]);
      apply_f32<I, Op>(buf, buf, m);
      for (int64_t i = 0; i < m; ++i) d[(i0 + i) * so] = st<T>(buf[i]);
    }
  } else {
    if (so == 1 && si == 1) {
      for (int64_t i = 0; i < n; ++i) d[i] = Op::template f<T>(s[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) d[i * so] = Op::template f<T>(s[i * si]);
    }
  }
}

template <class Op, class T> void unary_kernel(Cpu::M out, Cpu::V in) {
  const Plan<2> p = make_plan<2>(out.layout.shape, {&out.layout.strides, &in.layout.strides}, {out.layout.offset, in.layout.offset});
  T* o = out.storage.as<T>();
  const T* x = in.storage.as<T>();
  const int64_t so = p.inner(0), si = p.inner(1);
  const int64_t grain = is_math_v<Op> ? kGrainMath : kGrainCheap;
  const auto run = [] {  // the half types use the vector math too; its ops get an AVX-512 variant
    if constexpr (is_vm_v<Op> && std::is_same_v<compute_t<T>, float>)
      return pick<unary_run<Baseline, Op, T>, unary_run<Avx2, Op, T>, unary_run<Avx512, Op, T>>();
    else
      return pick_if<is_float_v<T>, unary_run<Baseline, Op, T>, unary_run<Avx2, Op, T>>();
  }();
  for_each_parallel(p, grain, [&](const std::array<int64_t, 2>& off, int64_t n) { run(o + off[0], x + off[1], n, so, si); });
}

}  // namespace

template <class Op> void Cpu::unary(M out, V in) {
  checks::unary<Op>(out, in);
  visit_dtype(in.dtype, [&]<class T>(type_tag<T>) {
    if constexpr (checks::unary_supported_v<Op, T>) unary_kernel<Op, T>(out, in);
  });
}

// Fused SwiGLU (contract in core/fused_swiglu.hpp): s = sigmoid(a) through the vector math, a chunk
// of kSwigluBuf at a time in a stack buffer, then one fused loop; doubles use the scalar formula. An
// output may be an input's memory (da over a, db over b or dy, core/fused_swiglu.hpp): each
// element's inputs are loaded before its outputs are stored.
namespace {
constexpr int64_t kSwigluBuf = 256;

template <class I, class T> void sigmoid_chunk(const T* a, T* s, int64_t m) {
  if constexpr (std::is_same_v<T, float>)
    vm::sigmoid_n(I{}, a, s, m);
  else
    for (int64_t i = 0; i < m; ++i) s[i] = op::Sigmoid::f<T>(a[i]);
}

template <class I, class T> void swiglu_fwd_range(T* y, const T* a, const T* b, int64_t i0, int64_t i1) {
  alignas(32) T s[kSwigluBuf];
  for (int64_t c = i0; c < i1; c += kSwigluBuf) {
    const int64_t m = std::min(kSwigluBuf, i1 - c);
    sigmoid_chunk<I>(a + c, s, m);
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) y[c + i] = a[c + i] * s[i] * b[c + i];
  }
}

template <class I, class T> void swiglu_bwd_range(T* da, T* db, const T* a, const T* b, const T* dy, int64_t i0, int64_t i1) {
  alignas(32) T s[kSwigluBuf];
  for (int64_t c = i0; c < i1; c += kSwigluBuf) {
    const int64_t m = std::min(kSwigluBuf, i1 - c);
    sigmoid_chunk<I>(a + c, s, m);
#pragma omp simd
    for (int64_t i = 0; i < m; ++i) {
      const T x = a[c + i], bi = b[c + i], si = s[i], g = dy[c + i];
      db[c + i] = g * x * si;
      da[c + i] = g * bi * si * (T(1) + x * (T(1) - si));
    }
  }
}
}  // namespace

void Cpu::swiglu_forward(M y, V a, V b) {
  const int64_t n = a.layout.numel();
  float_types(a.dtype, "swiglu", [&]<class T>(type_tag<T>) {
    const auto run = pick<swiglu_fwd_range<Baseline, T>, swiglu_fwd_range<Avx2, T>, swiglu_fwd_range<Avx512, T>>();
    T* py = ptr<T>(y.storage) + y.layout.offset;
    const T *pa = ptr<T>(a.storage) + a.layout.offset, *pb = ptr<T>(b.storage) + b.layout.offset;
    parallel_for(n, kGrainMath, [&](int64_t i0, int64_t i1) { run(py, pa, pb, i0, i1); });
  });
}

void Cpu::swiglu_backward(M da, M db, V a, V b, V dy) {
  const int64_t n = a.layout.numel();
  float_types(a.dtype, "swiglu_backward", [&]<class T>(type_tag<T>) {
    const auto run = pick<swiglu_bwd_range<Baseline, T>, swiglu_bwd_range<Avx2, T>, swiglu_bwd_range<Avx512, T>>();
    T *pda = ptr<T>(da.storage) + da.layout.offset, *pdb = ptr<T>(db.storage) + db.layout.offset;
    const T *pa = ptr<T>(a.storage) + a.layout.offset, *pb = ptr<T>(b.storage) + b.layout.offset;
    const T* pg = ptr<T>(dy.storage) + dy.layout.offset;
    parallel_for(n, kGrainMath, [&](int64_t i0, int64_t i1) { run(pda, pdb, pa, pb, pg, i0, i1); });
  });
}

#define KILN_INST_UNARY(OP) template void Cpu::unary<op::OP>(M, V);
KILN_UNARY_OPS(KILN_INST_UNARY)
#undef KILN_INST_UNARY

}  // namespace kiln
