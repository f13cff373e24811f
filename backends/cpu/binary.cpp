// binary<Op>: the walk hands each run its three strides; unit strides, a scalar operand (stride 0) and
// the general strided case each get their own loop so the first two vectorise (at baseline with SSE2,
// in the AVX2 variant with AVX2: the run is a kernel with variants per instruction set, common.hpp).
#include "kiln/backends/checks.hpp"
#include "kiln/backends/cpu/common.hpp"

namespace kiln {
using namespace cpu;

namespace {

template <class Op, class T> inline auto bin(T a, T b) {
  if constexpr (std::is_same_v<compute_t<T>, T>) {
    return Op::template f<T>(a, b);
  } else {
    const auto r = Op::template f<float>(static_cast<float>(a), static_cast<float>(b));
    if constexpr (Op::compare)
      return r;
    else
      return T(r);
  }
}

// Kernel (common.hpp): one run of n elements.
template <class I, class Op, class T, class O>
void binary_run(O* d, const T* u, const T* v, int64_t n, int64_t so, int64_t sa, int64_t sb) {
  if (so == 1 && sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; ++i) d[i] = bin<Op>(u[i], v[i]);
  } else if (so == 1 && sa == 1 && sb == 0) {
    const T s = v[0];
    for (int64_t i = 0; i < n; ++i) d[i] = bin<Op>(u[i], s);
  } else if (so == 1 && sa == 0 && sb == 1) {
    const T s = u[0];
    for (int64_t i = 0; i < n; ++i) d[i] = bin<Op>(s, v[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) d[i * so] = bin<Op>(u[i * sa], v[i * sb]);
  }
}

template <class Op, class T> void binary_kernel(Cpu::M out, Cpu::V a, Cpu::V b) {
  using O = std::conditional_t<Op::compare, bool, T>;
  const Plan<3> p = make_plan<3>(out.layout.shape, {&out.layout.strides, &a.layout.strides, &b.layout.strides},
                                 {out.layout.offset, a.layout.offset, b.layout.offset});
  O* o = out.storage.as<O>();
  const T* x = a.storage.as<T>();
  const T* y = b.storage.as<T>();
  const int64_t so = p.inner(0), sa = p.inner(1), sb = p.inner(2);
  const int64_t grain = std::is_same_v<Op, op::Pow> ? kGrainMath : kGrainCheap;
  const auto run = pick_if<avx2_dtype_v<T>, binary_run<Baseline, Op, T, O>, binary_run<Avx2, Op, T, O>>();  // integer ops: baseline
  for_each_parallel(p, grain,
                    [&](const std::array<int64_t, 3>& off, int64_t n) { run(o + off[0], x + off[1], y + off[2], n, so, sa, sb); });
}

}  // namespace

template <class Op> void Cpu::binary(M out, V a, V b) {
  checks::binary<Op>(out, a, b);
  visit_dtype(a.dtype, [&]<class T>(type_tag<T>) {
    if constexpr (checks::binary_supported_v<Op, T>) binary_kernel<Op, T>(out, a, b);
  });
}

#define KILN_INST_BINARY(OP) template void Cpu::binary<op::OP>(M, V, V);
KILN_BINARY_OPS(KILN_INST_BINARY)
#undef KILN_INST_BINARY

}  // namespace kiln
