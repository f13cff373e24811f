#pragma once
// The bridge between the test (namespace kiln, linked with libkiln) and the emulated Cuda backend
// (compiled with -Dkiln=kilnemu): plain types only. A Buf is a caller-owned host buffer with a view
// on it; dtype is kiln::DType as an int. Every call throws std::runtime_error with the backend's
// message when the primitive throws.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cuda_emu {

struct Buf {
  void* data = nullptr;
  size_t bytes = 0;
  int dtype = 0;
  std::vector<int64_t> shape, strides;
  int64_t offset = 0;
};

void fill(const Buf& out, double value, bool integral, int64_t ivalue);
void copy(const Buf& out, const Buf& in);
void unary(const std::string& op, const Buf& out, const Buf& in);  // op: the Op's name ("exp")
void binary(const std::string& op, const Buf& out, const Buf& a, const Buf& b);
void where(const Buf& out, const Buf& cond, const Buf& a, const Buf& b);
void reduce(const std::string& op, const Buf& out, const Buf& in, int axis);  // sum prod max min argmax argmin
void gather(const Buf& out, const Buf& src, int axis, const Buf& index);
void scatter_add(const Buf& out, int axis, const Buf& index, const Buf& src);
void rand_uniform(const Buf& out, uint64_t seed, uint64_t offset, double lo, double hi);
void rand_normal(const Buf& out, uint64_t seed, uint64_t offset, double mean, double std);
// fused ops (f32/f64 or float dtypes as the kernels allow)
void softmax_lastdim(const Buf& out, const Buf& x, bool log);
void softmax_lastdim_backward(const Buf& dx, const Buf& y, const Buf& dy, bool log);
void rms_norm_forward(const Buf& y, const Buf& rstd, const Buf& x, const Buf* w, double eps);
void rms_norm_backward(const Buf& dx, const Buf* dw, const Buf& x, const Buf* w, const Buf& rstd, const Buf& dy);
void cross_entropy_forward(const Buf& loss, const Buf& lse, const Buf& logits, const Buf& targets, int64_t ignore_index, double smoothing);
void cross_entropy_backward(const Buf& dlogits, const Buf& logits, const Buf& lse, const Buf& targets, const Buf& g, int64_t ignore_index,
                            double smoothing);
// Attention Residuals' fused depth attention (depth.cu; f32/f64 contiguous rows)
void depth_attention_forward(const Buf& h, const Buf& alpha, const Buf& rstd, const std::vector<Buf>& v, const Buf& q, double eps);
void depth_attention_backward(const std::vector<Buf>& dv, const Buf& dq, const std::vector<Buf>& v, const Buf& q, const Buf& alpha,
                              const Buf& rstd, const Buf& dh);
void depth_attention_phase1(const Buf& m, const Buf& l, const Buf& acc, const std::vector<Buf>& v, const Buf& Q, double eps);
void depth_attention_merge(const Buf& h, const Buf& m, const Buf& l, const Buf& acc, const Buf* p, const Buf& q, double eps);
// flash attention (attention.cu): q [B, H, T, d], k [B, Hkv, S, d], v [B, Hkv, S, dv]; outputs contiguous;
// mask: nullptr or a bool / additive [B, H, T, S] view (any strides); f32 on the tensor-core kernels
// where the head dims allow, unless set_attention_tensor_cores(false) (as cuda::set_attention_tensor_cores)
void set_attention_tensor_cores(bool on);
void attention_forward(const Buf& o, const Buf& lse, const Buf& q, const Buf& k, const Buf& v, const Buf* key_padding, const Buf* mask,
                       double scale, bool causal, int64_t pos0);
void attention_backward(const Buf& dq, const Buf& dk, const Buf& dv, const Buf& q, const Buf& k, const Buf& v, const Buf& o, const Buf& lse,
                        const Buf& dout, const Buf* key_padding, const Buf* mask, double scale, bool causal, int64_t pos0);

// multi-tensor Adam/AdamW (optim.cu); hyper-parameters as core/fused_optim_params.hpp's AdamHyper
struct Adam {
  double lr, beta1, beta2, eps, weight_decay;
  bool decoupled;
  double bc1, bc2_sqrt;
};
void adam_step(const std::vector<Buf>& w, const std::vector<Buf>& m, const std::vector<Buf>& v, const std::vector<Buf>& g, const Adam& h);

// Kernel launches so far (emu::stats()).
uint64_t launches();
// ... of them, launches of the vectorised elementwise kernel.
uint64_t vec_launches();
// Schedule the threads of a block in reverse order (emu::set_reverse_order).
void set_reverse_order(bool on);

}  // namespace cuda_emu
