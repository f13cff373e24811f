// unary<Op>: contiguous runs go straight to the array kernels; strided runs and the half types pass
// through a small float buffer so they use the same vector code.
#include "kiln/backends/checks.hpp"
#include "kiln/backends/cpu/common.hpp"
#include "kiln/backends/cpu/vecmath.hpp"

namespace kiln {
using namespace cpu;

namespace {

template <class Op> constexpr bool is_math_v =
    std::is_same_v<Op, op::Exp> || std::is_same_v<Op, op::Log> || std::is_same_v<Op, op::Tanh> || std::is_same_v<Op, op::Sigmoid> ||
    std::is_same_v<Op, op::Silu> || std::is_same_v<Op, op::Gelu> || std::is_same_v<Op, op::GeluTanh> ||
    std::is_same_v<Op, op::Log1p> || std::is_same_v<Op, op::Expm1> || std::is_same_v<Op, op::Sin> || std::is_same_v<Op, op::Cos> ||
    std::is_same_v<Op, op::Pow>;

// y = Op(x) over n contiguous floats (x may equal y).
template <class Op> void apply_f32(const float* x, float* y, int64_t n) {
  if constexpr (std::is_same_v<Op, op::Exp>) vm::exp_n(x, y, n);
  else if constexpr (std::is_same_v<Op, op::Log>) vm::log_n(x, y, n);
  else if constexpr (std::is_same_v<Op, op::Tanh>) vm::tanh_n(x, y, n);
  else if constexpr (std::is_same_v<Op, op::Sigmoid>) vm::sigmoid_n(x, y, n);
  else if constexpr (std::is_same_v<Op, op::Silu>) vm::silu_n(x, y, n);
  else if constexpr (std::is_same_v<Op, op::GeluTanh>) vm::gelu_tanh_n(x, y, n);
  else if constexpr (std::is_same_v<Op, op::Gelu>) for (int64_t i = 0; i < n; ++i) y[i] = vm::gelu_s(x[i]);
#ifdef KILN_CPU_AVX2
  else if constexpr (std::is_same_v<Op, op::Sqrt> || std::is_same_v<Op, op::Rsqrt>) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      __m256 r = _mm256_sqrt_ps(_mm256_loadu_ps(x + i));
      if constexpr (std::is_same_v<Op, op::Rsqrt>) r = _mm256_div_ps(_mm256_set1_ps(1.0f), r);
      _mm256_storeu_ps(y + i, r);
    }
    for (; i < n; ++i) y[i] = Op::template f<float>(x[i]);
  }
#endif
  else for (int64_t i = 0; i < n; ++i) y[i] = Op::template f<float>(x[i]);
}

template <class Op, class T> void unary_kernel(Cpu::M out, Cpu::V in) {
  const Plan<2> p = make_plan<2>(out.layout.shape, {&out.layout.strides, &in.layout.strides}, {out.layout.offset, in.layout.offset});
  T* o = out.storage.as<T>();
  const T* x = in.storage.as<T>();
  const int64_t so = p.inner(0), si = p.inner(1);
  const int64_t grain = is_math_v<Op> ? kGrainMath : kGrainCheap;
  for_each_parallel(p, grain, [&](const std::array<int64_t, 2>& off, int64_t n) {
    T* d = o + off[0];
    const T* s = x + off[1];
    if constexpr (std::is_same_v<compute_t<T>, float>) {
      if constexpr (std::is_same_v<T, float>) {
        if (so == 1 && si == 1) return apply_f32<Op>(s, d, n);
      }
      constexpr int64_t kBuf = 256;
      alignas(32) float buf[kBuf];
      for (int64_t i0 = 0; i0 < n; i0 += kBuf) {
        const int64_t m = std::min(kBuf, n - i0);
        for (int64_t i = 0; i < m; ++i) buf[i] = static_cast<float>(s[(i0 + i) * si]);
        apply_f32<Op>(buf, buf, m);
        for (int64_t i = 0; i < m; ++i) d[(i0 + i) * so] = st<T>(buf[i]);
      }
    } else {
      if (so == 1 && si == 1) {
        for (int64_t i = 0; i < n; ++i) d[i] = Op::template f<T>(s[i]);
      } else {
        for (int64_t i = 0; i < n; ++i) d[i * so] = Op::template f<T>(s[i * si]);
      }
    }
  });
}

}  // namespace

template <class Op> void Cpu::unary(M out, V in) {
  checks::unary<Op>(out, in);
  visit_dtype(in.dtype, [&]<class T>(type_tag<T>) {
    if constexpr (checks::unary_supported_v<Op, T>) unary_kernel<Op, T>(out, in);
  });
}

#define KILN_INST_UNARY(OP) template void Cpu::unary<op::OP>(M, V);
KILN_UNARY_OPS(KILN_INST_UNARY)
#undef KILN_INST_UNARY

}  // namespace kiln
