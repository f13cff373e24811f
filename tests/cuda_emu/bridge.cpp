// The bridge (bridge.hpp), compiled with -Dkiln=kilnemu against the emulated Cuda backend.
#include "bridge.hpp"

#include <exception>
#include <memory>
#include <stdexcept>

#include <kiln/backends/cuda/cuda.hpp>
#include <kiln/backends/cuda/cuda_backend.hpp>
#include "emu.hpp"

namespace cuda_emu {

namespace {

using kiln::Cuda;

// Caller-owned memory as Cuda storage (not freed by the storage: device 1, see emu_runtime.cpp).
struct Wrapped {
  kiln::CudaStorage storage;
  kiln::Layout layout;
  kiln::DType dtype;
  explicit Wrapped(const Buf& b)
      : storage(kiln::cuda::CachingAllocator::Block{b.data, b.bytes}, b.bytes, 1),
        layout(kiln::Shape(b.shape.begin(), b.shape.end()), kiln::Strides(b.strides.begin(), b.strides.end()), b.offset),
        dtype(static_cast<kiln::DType>(b.dtype)) {}
  Cuda::M m() { return {storage, layout, dtype}; }
  Cuda::V v() const { return {storage, layout, dtype}; }
};

template <class F> void guarded(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    throw std::runtime_error(e.what());
  }
}

}  // namespace

void fill(const Buf& out, double value, bool integral, int64_t ivalue) {
  guarded([&] {
    Wrapped o(out);
    Cuda::fill(o.m(), integral ? kiln::Scalar(ivalue) : kiln::Scalar(value));
  });
}

void copy(const Buf& out, const Buf& in) {
  guarded([&] {
    Wrapped o(out), i(in);
    Cuda::copy(o.m(), i.v());
  });
}

void unary(const std::string& op, const Buf& out, const Buf& in) {
  guarded([&] {
    Wrapped o(out), i(in);
#define KILN_EMU_UNARY(OP) \
  if (op == kiln::op::OP::name) return Cuda::unary<kiln::op::OP>(o.m(), i.v());
    KILN_UNARY_OPS(KILN_EMU_UNARY)
#undef KILN_EMU_UNARY
    throw std::runtime_error("cuda_emu::unary: unknown op " + op);
  });
}

void binary(const std::string& op, const Buf& out, const Buf& a, const Buf& b) {
  guarded([&] {
    Wrapped o(out), x(a), y(b);
#define KILN_EMU_BINARY(OP) \
  if (op == kiln::op::OP::name) return Cuda::binary<kiln::op::OP>(o.m(), x.v(), y.v());
    KILN_BINARY_OPS(KILN_EMU_BINARY)
#undef KILN_EMU_BINARY
    throw std::runtime_error("cuda_emu::binary: unknown op " + op);
  });
}

void where(const Buf& out, const Buf& cond, const Buf& a, const Buf& b) {
  guarded([&] {
    Wrapped o(out), c(cond), x(a), y(b);
    Cuda::where(o.m(), c.v(), x.v(), y.v());
  });
}

void reduce(const std::string& op, const Buf& out, const Buf& in, int axis) {
  guarded([&] {
    Wrapped o(out), i(in);
#define KILN_EMU_REDUCE(OP) \
  if (op == kiln::op::OP::name) return Cuda::reduce<kiln::op::OP>(o.m(), i.v(), axis);
    KILN_REDUCE_OPS(KILN_EMU_REDUCE)
    KILN_INDEX_REDUCE_OPS(KILN_EMU_REDUCE)
#undef KILN_EMU_REDUCE
    throw std::runtime_error("cuda_emu::reduce: unknown op " + op);
  });
}

void gather(const Buf& out, const Buf& src, int axis, const Buf& index) {
  guarded([&] {
    Wrapped o(out), s(src), ix(index);
    Cuda::gather(o.m(), s.v(), axis, ix.v());
  });
}

void scatter_add(const Buf& out, int axis, const Buf& index, const Buf& src) {
  guarded([&] {
    Wrapped o(out), ix(index), s(src);
    Cuda::scatter_add(o.m(), axis, ix.v(), s.v());
  });
}

void rand_uniform(const Buf& out, uint64_t seed, uint64_t offset, double lo, double hi) {
  guarded([&] {
    Wrapped o(out);
    Cuda::rand_uniform(o.m(), seed, offset, lo, hi);
  });
}

void rand_normal(const Buf& out, uint64_t seed, uint64_t offset, double mean, double std) {
  guarded([&] {
    Wrapped o(out);
    Cuda::rand_normal(o.m(), seed, offset, mean, std);
  });
}

namespace {
// Wrapped views of several buffers (Wrapped holds a storage: not copyable, so kept by pointer).
struct Many {
  std::vector<std::unique_ptr<Wrapped>> w;
  explicit Many(const std::vector<Buf>& bufs) {
    for (const Buf& b : bufs) w.push_back(std::make_unique<Wrapped>(b));
  }
  std::vector<Cuda::V> views() const {
    std::vector<Cuda::V> v;
    for (const auto& x : w) v.push_back(x->v());
    return v;
  }
  std::vector<Cuda::M> muts() {
    std::vector<Cuda::M> m;
    for (auto& x : w) m.push_back(x->m());
    return m;
  }
};
}  // namespace

#if defined(KILN_EMU_DENSE)
void softmax_lastdim(const Buf& out, const Buf& x, bool log) {
  guarded([&] {
    Wrapped o(out), i(x);
    Cuda::softmax_lastdim(o.m(), i.v(), log);
  });
}

void softmax_lastdim_backward(const Buf& dx, const Buf& y, const Buf& dy, bool log) {
  guarded([&] {
    Wrapped d(dx), yy(y), g(dy);
    Cuda::softmax_lastdim_backward(d.m(), yy.v(), g.v(), log);
  });
}

void rms_norm_forward(const Buf& y, const Buf& rstd, const Buf& x, const Buf* w, double eps) {
  guarded([&] {
    Wrapped yy(y), r(rstd), xx(x);
    std::unique_ptr<Wrapped> ww = w ? std::make_unique<Wrapped>(*w) : nullptr;
    const Cuda::V wv = ww ? ww->v() : xx.v();
    Cuda::rms_norm_forward(yy.m(), r.m(), xx.v(), ww ? &wv : nullptr, eps);
  });
}

void rms_norm_backward(const Buf& dx, const Buf* dw, const Buf& x, const Buf* w, const Buf& rstd, const Buf& dy) {
  guarded([&] {
    Wrapped d(dx), xx(x), r(rstd), g(dy);
    std::unique_ptr<Wrapped> ww = w ? std::make_unique<Wrapped>(*w) : nullptr;
    std::unique_ptr<Wrapped> dww = dw ? std::make_unique<Wrapped>(*dw) : nullptr;
    const Cuda::V wv = ww ? ww->v() : xx.v();
    Cuda::M dwm = dww ? dww->m() : d.m();
    Cuda::rms_norm_backward(d.m(), dww ? &dwm : nullptr, xx.v(), ww ? &wv : nullptr, r.v(), g.v());
  });
}

void cross_entropy_forward(const Buf& loss, const Buf& lse, const Buf& logits, const Buf& targets, int64_t ignore_index, double smoothing) {
  guarded([&] {
    Wrapped l(loss), s(lse), x(logits), t(targets);
    Cuda::cross_entropy_forward(l.m(), s.m(), x.v(), t.v(), ignore_index, smoothing);
  });
}

void cross_entropy_backward(const Buf& dlogits, const Buf& logits, const Buf& lse, const Buf& targets, const Buf& g, int64_t ignore_index,
                            double smoothing) {
  guarded([&] {
    Wrapped d(dlogits), x(logits), s(lse), t(targets), gg(g);
    Cuda::cross_entropy_backward(d.m(), x.v(), s.v(), t.v(), gg.v(), ignore_index, smoothing);
  });
}

void depth_attention_forward(const Buf& h, const Buf& alpha, const Buf& rstd, const std::vector<Buf>& v, const Buf& q, double eps) {
  guarded([&] {
    Wrapped hh(h), a(alpha), r(rstd), qq(q);
    const Many vs(v);
    Cuda::depth_attention_forward(hh.m(), a.m(), r.m(), vs.views(), qq.v(), eps);
  });
}

void depth_attention_backward(const std::vector<Buf>& dv, const Buf& dq, const std::vector<Buf>& v, const Buf& q, const Buf& alpha,
                              const Buf& rstd, const Buf& dh) {
  guarded([&] {
    Wrapped d(dq), qq(q), a(alpha), r(rstd), g(dh);
    Many dvs(dv);
    const Many vs(v);
    Cuda::depth_attention_backward(dvs.muts(), d.m(), vs.views(), qq.v(), a.v(), r.v(), g.v());
  });
}

void depth_attention_phase1(const Buf& m, const Buf& l, const Buf& acc, const std::vector<Buf>& v, const Buf& Q, double eps) {
  guarded([&] {
    Wrapped mm(m), ll(l), aa(acc), qq(Q);
    const Many vs(v);
    Cuda::depth_attention_phase1(mm.m(), ll.m(), aa.m(), vs.views(), qq.v(), eps);
  });
}

void depth_attention_merge(const Buf& h, const Buf& m, const Buf& l, const Buf& acc, const Buf* p, const Buf& q, double eps) {
  guarded([&] {
    Wrapped hh(h), mm(m), ll(l), aa(acc), qq(q);
    std::unique_ptr<Wrapped> pp = p ? std::make_unique<Wrapped>(*p) : nullptr;
    const Cuda::V pv = pp ? pp->v() : aa.v();
    Cuda::depth_attention_merge(hh.m(), mm.v(), ll.v(), aa.v(), pp ? &pv : nullptr, qq.v(), eps);
  });
}
#endif

void set_attention_tensor_cores(bool on) { kiln::cuda::set_attention_tensor_cores(on); }

void attention_forward(const Buf& o, const Buf& lse, const Buf& q, const Buf& k, const Buf& v, const Buf* key_padding, const Buf* mask,
                       double scale, bool causal, int64_t pos0) {
  guarded([&] {
    Wrapped oo(o), ll(lse), qq(q), kk(k), vv(v);
    std::unique_ptr<Wrapped> kp = key_padding ? std::make_unique<Wrapped>(*key_padding) : nullptr;
    std::unique_ptr<Wrapped> mk = mask ? std::make_unique<Wrapped>(*mask) : nullptr;
    const Cuda::V kpv = kp ? kp->v() : qq.v(), mkv = mk ? mk->v() : qq.v();
    Cuda::attention_forward(oo.m(), ll.m(), qq.v(), kk.v(), vv.v(), kp ? &kpv : nullptr, mk ? &mkv : nullptr, scale, causal, pos0, 0.0);
  });
}

void attention_backward(const Buf& dq, const Buf& dk, const Buf& dv, const Buf& q, const Buf& k, const Buf& v, const Buf& o, const Buf& lse,
                        const Buf& dout, const Buf* key_padding, const Buf* mask, double scale, bool causal, int64_t pos0) {
  guarded([&] {
    Wrapped a(dq), b(dk), c(dv), qq(q), kk(k), vv(v), oo(o), ll(lse), dd(dout);
    std::unique_ptr<Wrapped> kp = key_padding ? std::make_unique<Wrapped>(*key_padding) : nullptr;
    std::unique_ptr<Wrapped> mk = mask ? std::make_unique<Wrapped>(*mask) : nullptr;
    const Cuda::V kpv = kp ? kp->v() : qq.v(), mkv = mk ? mk->v() : qq.v();
    Cuda::attention_backward(a.m(), b.m(), c.m(), qq.v(), kk.v(), vv.v(), oo.v(), ll.v(), dd.v(), kp ? &kpv : nullptr, mk ? &mkv : nullptr,
                             scale, causal, pos0, 0.0);
  });
}

void adam_step(const std::vector<Buf>& w, const std::vector<Buf>& m, const std::vector<Buf>& v, const std::vector<Buf>& g, const Adam& h) {
  guarded([&] {
    Many ww(w), mm(m), vv(v);
    const Many gg(g);
    kiln::fused::AdamHyper k;
    k.lr = h.lr;
    k.beta1 = h.beta1;
    k.beta2 = h.beta2;
    k.eps = h.eps;
    k.weight_decay = h.weight_decay;
    k.decoupled = h.decoupled;
    k.bc1 = h.bc1;
    k.bc2_sqrt = h.bc2_sqrt;
    Cuda::adam_step(ww.muts(), mm.muts(), vv.muts(), gg.views(), k);
  });
}

uint64_t launches() { return emu::stats().launches; }
uint64_t vec_launches() { return emu::stats().vec_launches; }
void set_reverse_order(bool on) { emu::set_reverse_order(on); }

}  // namespace cuda_emu
