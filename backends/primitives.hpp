#pragma once
// The one list of what a backend declares (docs/adding_a_backend.md). A backend's struct defines
// Storage, V = View<Storage>, M = MutView<Storage>, `name` and its memory functions (allocate, write,
// read), then writes KILN_BACKEND_PRIMITIVES (what the Backend concept of core/backend.hpp requires of
// every backend) and one line per fused family it overrides. Each family has a composite default in
// core/fused*.hpp, so a backend that leaves a line out runs the default; its .cpp/.cu files define
// what it declares. Used by backends/reference/reference.hpp, backends/cpu/cpu.hpp and
// backends/cuda/cuda_backend.hpp (plain C++: included by .cu files too).
#include <cstdint>
#include <vector>

#include "kiln/core/conv_params.hpp"
#include "kiln/core/fused_optim_params.hpp"

// Every backend: fill, copy, the op-tag families, matmul, indexing and Philox random fill.
#define KILN_BACKEND_PRIMITIVES                                                          \
  static void fill(M out, Scalar value);                                                 \
  static void copy(M out, V in);                                                         \
  template <class Op> static void unary(M out, V in);                                    \
  template <class Op> static void binary(M out, V a, V b);                               \
  static void where(M out, V cond, V a, V b);                                            \
  template <class Op> static void reduce(M out, V in, int axis);                         \
  static void matmul(M out, V a, V b);                                                   \
  static void gather(M out, V src, int axis, V index);                                   \
  static void scatter_add(M out, int axis, V index, V src);                              \
  static void rand_uniform(M out, uint64_t seed, uint64_t offset, double lo, double hi); \
  static void rand_normal(M out, uint64_t seed, uint64_t offset, double mean, double std);

// softmax / log-softmax along the last dim (core/fused.hpp)
#define KILN_FUSED_SOFTMAX                           \
  static void softmax_lastdim(M out, V x, bool log); \
  static void softmax_lastdim_backward(M dx, V y, V dy, bool log);

// RMSNorm (core/fused_norm.hpp)
#define KILN_FUSED_RMS_NORM                                               \
  static void rms_norm_forward(M y, M rstd, V x, const V* w, double eps); \
  static void rms_norm_backward(M dx, M* dw, V x, const V* w, V rstd, V dy);

// SwiGLU gating silu(a)·b (core/fused_swiglu.hpp)
#define KILN_FUSED_SWIGLU                    \
  static void swiglu_forward(M y, V a, V b); \
  static void swiglu_backward(M da, M db, V a, V b, V dy);

// RoPE turn of x's pairs by cos/sin, or back (core/fused_rope.hpp)
#define KILN_FUSED_ROPE static void rope(M y, V x, V cos, V sin, bool inverse);

// Differential attention V2's head pairing (core/fused_diff2.hpp)
#define KILN_FUSED_DIFF2_COMBINE                    \
  static void diff2_combine_forward(M y, V a, V l); \
  static void diff2_combine_backward(M da, M dl, V a, V l, V dy);

// depth attention of Attention Residuals (core/fused_depth.hpp)
#define KILN_FUSED_DEPTH_ATTENTION                                                                                           \
  static void depth_attention_forward(M h, M alpha, M rstd, const std::vector<V>& v, V q, double eps);                       \
  static void depth_attention_backward(const std::vector<M>& dv, M dq, const std::vector<V>& v, V q, V alpha, V rstd, V dh); \
  static void depth_attention_phase1(M m, M l, M acc, const std::vector<V>& v, V Q, double eps);                             \
  static void depth_attention_merge(M h, V m, V l, V acc, const V* p, V q, double eps);

// softmax cross-entropy (core/fused_loss.hpp)
#define KILN_FUSED_CROSS_ENTROPY                                                                                 \
  static void cross_entropy_forward(M loss, M lse, V logits, V targets, int64_t ignore_index, double smoothing); \
  static void cross_entropy_backward(M dlogits, V logits, V lse, V targets, V g, int64_t ignore_index, double smoothing);

// multi-tensor Adam/AdamW step (core/fused_optim.hpp)
#define KILN_FUSED_ADAM                                                                                                     \
  static void adam_step(const std::vector<M>& w, const std::vector<M>& m, const std::vector<M>& v, const std::vector<V>& g, \
                        const fused::AdamHyper& h);

// Σ x² over a list of tensors, in f64 (core/fused_optim.hpp)
#define KILN_FUSED_SUM_SQUARES static void sum_squares(M out, const std::vector<V>& xs);

// flash attention, forward and backward (core/fused.hpp)
#define KILN_FUSED_ATTENTION                                                                                                             \
  static void attention_forward(M o, M lse, V q, V k, V v, const V* key_padding, const V* mask, double scale, bool causal, int64_t pos0, \
                                double softcap);                                                                                         \
  static void attention_backward(M dq, M dk, M dv, V q, V k, V v, V o, V lse, V dout, const V* key_padding, const V* mask, double scale, \
                                 bool causal, int64_t pos0, double softcap);

// differential attention, both branches in one op (core/fused_diff_attention.hpp)
#define KILN_FUSED_DIFF_ATTENTION                                                                                                          \
  static void diff_attention_forward(M o, M o2, M lse1, M lse2, V q1, V q2, V k1, V k2, V v, V lam, const V* key_padding, const V* mask,   \
                                     double scale, bool causal, int64_t pos0);                                                             \
  static void diff_attention_backward(M dq1, M dq2, M dk1, M dk2, M dv, M dlam, V q1, V q2, V k1, V k2, V v, V lam, V o, V o2, V lse1,     \
                                      V lse2, V dout, const V* key_padding, const V* mask, double scale, bool causal, int64_t pos0);       \
  /* with the head-wise norm in the epilogue */                                                                                            \
  static void diff_attention_norm_forward(M y, M rstd, M o, M o2, M lse1, M lse2, V q1, V q2, V k1, V k2, V v, V lam, V wc,                \
                                          const V* key_padding, const V* mask, double eps, double scale, bool causal, int64_t pos0);       \
  static void diff_attention_norm_backward(M dq1, M dq2, M dk1, M dk2, M dv, M dlam, M dwc, V q1, V q2, V k1, V k2, V v, V lam, V wc, V o, \
                                           V o2, V lse1, V lse2, V rstd, V dy, const V* key_padding, const V* mask, double scale,          \
                                           bool causal, int64_t pos0);

// convolution and pooling; false: this layout is not handled, the composite runs (core/fused_conv.hpp)
#define KILN_FUSED_CONV_POOL                                                         \
  static bool conv2d_forward(M y, V x, V w, const V* bias, const Conv2dParams& p);   \
  static bool conv2d_backward_input(M dx, V dy, V w, const Conv2dParams& p);         \
  static bool conv2d_backward_weight(M dw, M* db, V dy, V x, const Conv2dParams& p); \
  static bool max_pool2d_forward(M y, M idx, V x, const Pool2dParams& p);            \
  static bool max_pool2d_backward(M dx, V dy, V idx, const Pool2dParams& p);         \
  static bool avg_pool2d_forward(M y, V x, const Pool2dParams& p);                   \
  static bool avg_pool2d_backward(M dx, V dy, const Pool2dParams& p);
