#pragma once
// The Cpu backend: OpenBLAS (OpenMP build) or oneDNN for matmul, whichever measures faster for the
// shape class; OpenMP-parallel, vectorised loops for everything else; fused softmax. One OpenMP
// thread pool serves kiln and BLAS; its size comes from KILN_NUM_THREADS, else OMP_NUM_THREADS, else
// all cores (see threads.cpp).
#include <memory>
#include <string_view>
#include <vector>

#include "kiln/backends/host_storage.hpp"
#include "kiln/core/backend.hpp"
#include "kiln/core/conv_params.hpp"
#include "kiln/core/fused_optim_params.hpp"
#include "kiln/core/tensor.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

struct Cpu {
  using Storage = HostStorage;
  using V = View<Storage>;
  using M = MutView<Storage>;
  static constexpr std::string_view name = "cpu";

  static std::shared_ptr<Storage> allocate(size_t bytes) { return HostStorage::make(bytes); }
  static void write(Storage& s, size_t off, const void* src, size_t n) { s.write(off, src, n); }
  static void read(const Storage& s, size_t off, void* dst, size_t n) { s.read(off, dst, n); }

  static void fill(M out, Scalar value);
  static void copy(M out, V in);
  template <class Op> static void unary(M out, V in);
  template <class Op> static void binary(M out, V a, V b);
  static void where(M out, V cond, V a, V b);
  template <class Op> static void reduce(M out, V in, int axis);
  static void matmul(M out, V a, V b);
  static void gather(M out, V src, int axis, V index);
  static void scatter_add(M out, int axis, V index, V src);
  static void rand_uniform(M out, uint64_t seed, uint64_t offset, double lo, double hi);
  static void rand_normal(M out, uint64_t seed, uint64_t offset, double mean, double std);
  // fused RMSNorm (backends/cpu/norm.cpp; contract in core/fused_norm.hpp)
  static void rms_norm_forward(M y, M rstd, V x, const V* w, double eps);
  static void rms_norm_backward(M dx, M* dw, V x, const V* w, V rstd, V dy);

  // fused SwiGLU gating silu(a)·b (backends/cpu/unary.cpp; contract in core/fused_swiglu.hpp)
  static void swiglu_forward(M y, V a, V b);
  static void swiglu_backward(M da, M db, V a, V b, V dy);
  // fused RoPE turn of x's pairs by cos/sin, or back (backends/cpu/rope.cpp; contract in core/fused_rope.hpp)
  static void rope(M y, V x, V cos, V sin, bool inverse);

  // fused depth attention of Attention Residuals (backends/cpu/depth.cpp; contract in core/fused_depth.hpp)
  static void depth_attention_forward(M h, M alpha, M rstd, const std::vector<V>& v, V q, double eps);
  static void depth_attention_backward(const std::vector<M>& dv, M dq, const std::vector<V>& v, V q, V alpha, V rstd, V dh);
  static void depth_attention_phase1(M m, M l, M acc, const std::vector<V>& v, V Q, double eps);
  static void depth_attention_merge(M h, V m, V l, V acc, const V* p, V q, double eps);

  // fused overrides (core/fused.hpp)
  static void softmax_lastdim(M out, V x, bool log);
  static void softmax_lastdim_backward(M dx, V y, V dy, bool log);
  // fused softmax cross-entropy (backends/cpu/softmax.cpp; contract in core/fused_loss.hpp)
  static void cross_entropy_forward(M loss, M lse, V logits, V targets, int64_t ignore_index, double smoothing);
  static void cross_entropy_backward(M dlogits, V logits, V lse, V targets, V g, int64_t ignore_index, double smoothing);
  // multi-tensor Adam/AdamW (backends/cpu/optim.cpp; contract in core/fused_optim.hpp)
  static void adam_step(const std::vector<M>& w, const std::vector<M>& m, const std::vector<M>& v, const std::vector<V>& g,
                        const fused::AdamHyper& h);
  static void sum_squares(M out, const std::vector<V>& xs);  // Σ x² in f64 (core/fused_optim.hpp)
  // flash attention (backends/cpu/attention.cpp; contract in core/fused.hpp): outputs in the inputs'
  // layouts, every element written
  static constexpr bool attention_any_layout = true;
  static void attention_forward(M o, M lse, V q, V k, V v, const V* key_padding, const V* mask, double scale, bool causal, int64_t pos0);
  static void attention_backward(M dq, M dk, M dv, V q, V k, V v, V o, V lse, V dout, const V* key_padding, const V* mask, double scale,
                                 bool causal, int64_t pos0);
  // differential attention, both branches in one op (backends/cpu/attention.cpp; contract in
  // core/fused_diff_attention.hpp)
  static void diff_attention_forward(M o, M o2, M lse1, M lse2, V q1, V q2, V k1, V k2, V v, V lam, const V* key_padding,
                                     const V* mask, double scale, bool causal, int64_t pos0);
  static void diff_attention_backward(M dq1, M dq2, M dk1, M dk2, M dv, M dlam, V q1, V q2, V k1, V k2, V v, V lam, V o, V o2,
                                      V lse1, V lse2, V dout, const V* key_padding, const V* mask, double scale, bool causal,
                                      int64_t pos0);
  // convolution (oneDNN, backends/cpu/conv.cpp) and pooling (backends/cpu/pool.cpp); contract in core/fused_conv.hpp
  static bool conv2d_forward(M y, V x, V w, const V* bias, const Conv2dParams& p);
  static bool conv2d_backward_input(M dx, V dy, V w, const Conv2dParams& p);
  static bool conv2d_backward_weight(M dw, M* db, V dy, V x, const Conv2dParams& p);
  static bool max_pool2d_forward(M y, M idx, V x, const Pool2dParams& p);
  static bool max_pool2d_backward(M dx, V dy, V idx, const Pool2dParams& p);
  static bool avg_pool2d_forward(M y, V x, const Pool2dParams& p);
  static bool avg_pool2d_backward(M dx, V dy, const Pool2dParams& p);
};
static_assert(Backend<Cpu>);

// Threads used by kiln's loops and BLAS (KILN_NUM_THREADS > OMP_NUM_THREADS > all cores).
int num_threads();
void set_num_threads(int n);

// The instruction set of the Cpu backend's own kernels, chosen once at first use: "avx512" (AVX-512 F,
// BW, DQ, VL), "avx2" (AVX2 + FMA) or "baseline" (any x86-64, or another architecture). KILN_CPU_ISA=
// baseline|avx2|avx512 chooses; unset, the best this CPU has. Throws kiln::Error when KILN_CPU_ISA is
// unknown or asks for what the CPU lacks. (OpenBLAS and oneDNN pick their own code for the CPU.)
std::string_view cpu_isa();

// Whether bf16 matmuls run on oneDNN's native bf16 kernels (bf16 operands, f32 accumulation, the output
// rounded once), which need AVX512-BF16 or AMX (as oneDNN sees the CPU: ONEDNN_MAX_CPU_ISA applies) and
// not KILN_CPU_MATMUL=blas. Otherwise they convert the operands to f32, run sgemm and round the output
// once: the same contract, another summation order. f16 matmuls always take the f32 path.
bool native_bf16_matmul();

extern template class Tensor<Cpu>;

}  // namespace kiln
#pragma GCC visibility pop
