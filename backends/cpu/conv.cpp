// conv2d forward / backward-data / backward-weights through oneDNN's convolution primitives (f32).
//
// kiln's tensors are plain nchw activations and oihw (goihw for groups > 1) weights. Two ways to run:
//  * blocked: the primitives choose their layouts (format_tag::any: nChw8c/16c activations and blocked
//    weights, the direct JIT kernels), and each call reorders its inputs into them and its outputs
//    back. Despite the reorders, 1.1-4x faster than the plain layouts for kernels larger than 1x1
//    (first layers with 1 or 3 channels, wide layers, strided, 25x for depthwise: bench/conv,
//    bench/RESULTS.md "Convolution").
//  * plain: the primitives take the tensors as they lie, no reorder: 1x1 kernels, which oneDNN runs
//    as a GEMM there anyway (10% faster than blocked).
// prefer_blocked() picks one by shape alone (never by timing, so that every process and every run of
// a shape computes the same numbers). Primitives, reorders and their memory objects are cached per
// thread and problem signature, like the matmul (backends/cpu/matmul.cpp): a repeated call costs a
// few set_data_handle calls and the executes. f64 (oneDNN has none) and any problem oneDNN declines
// return false: core/fused_conv.hpp then runs the composite (im2col + OpenBLAS dgemm).
#include <memory>
#include <unordered_map>
#include <vector>

#include "kiln/backends/cpu/common.hpp"

#ifdef KILN_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace kiln {

#ifdef KILN_HAVE_ONEDNN
namespace {

using dnnl::memory;
using Dims = memory::dims;
enum Kind : int64_t { kForward, kBackwardData, kBackwardWeights };

struct VecHash {
  size_t operator()(const std::vector<int64_t>& v) const {
    size_t h = 1469598103934665603ull;
    for (int64_t x : v) h = (h ^ static_cast<size_t>(x)) * 1099511628211ull;
    return h;
  }
};

// One argument of a primitive: the user's buffer (plain layout) and, when the primitive wants another
// layout, its own buffer and the reorder between them (user -> own for inputs, own -> user for outputs).
struct Arg {
  memory user, own;
  std::shared_ptr<dnnl::reorder> reorder;
  void bind(const dnnl::engine& eng, const memory::desc& plain, const memory::desc& want, bool input) {
    user = memory(plain, eng, DNNL_MEMORY_NONE);
    if (want == plain) {
      own = user;
      return;
    }
    own = memory(want, eng);
    reorder = input ? std::make_shared<dnnl::reorder>(user, own) : std::make_shared<dnnl::reorder>(own, user);
  }
};

struct Entry {
  std::shared_ptr<dnnl::primitive> prim;  // null: oneDNN declined
  Arg src, wei, bias, dst;                // (diff_ variants for the backward kinds)
};

struct ConvThread {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{eng};
  std::unordered_map<std::vector<int64_t>, Entry, VecHash> cache;
};
ConvThread& thread_state() {
  thread_local ConvThread t;
  return t;
}

void sync_omp_threads() {
  const int n = num_threads();
  if (!omp_in_parallel() && omp_get_max_threads() != n) omp_set_num_threads(n);
}

// The problem: x [N, C, H, W], w [O, C/g, kh, kw], y [N, O, Ho, Wo].
struct Problem {
  Shape x, w, y;
  const Conv2dParams* p;
  bool bias;
  std::vector<int64_t> key(Kind k) const {
    std::vector<int64_t> v{k, bias};
    v.insert(v.end(), x.begin(), x.end());
    v.insert(v.end(), w.begin(), w.end());
    v.insert(v.end(), y.begin(), y.end());
    v.insert(v.end(), {p->stride.h, p->stride.w, p->padding.h, p->padding.w, p->dilation.h, p->dilation.w, p->groups});
    return v;
  }
  memory::desc src() const { return {Dims(x.begin(), x.end()), memory::data_type::f32, memory::format_tag::nchw}; }
  memory::desc dst() const { return {Dims(y.begin(), y.end()), memory::data_type::f32, memory::format_tag::nchw}; }
  memory::desc wei() const {
    if (p->groups == 1) return {Dims(w.begin(), w.end()), memory::data_type::f32, memory::format_tag::oihw};
    return {Dims{p->groups, w[0] / p->groups, w[1], w[2], w[3]}, memory::data_type::f32, memory::format_tag::goihw};
  }
  memory::desc bia() const { return {Dims{w[0]}, memory::data_type::f32, memory::format_tag::x}; }
  // The layouts the primitives are created with: the plain ones, or "any" (see the top of the file).
  bool prefer_blocked() const {
    return w[2] * w[3] > 1;  // all but 1x1 kernels (which are GEMMs on the plain layout already)
  }
  memory::desc any(const memory::desc& d) const {
    return prefer_blocked() ? memory::desc(d.dims(), memory::data_type::f32, memory::format_tag::any) : d;
  }
  Dims strides() const { return {p->stride.h, p->stride.w}; }
  Dims dilates() const { return {p->dilation.h - 1, p->dilation.w - 1}; }  // oneDNN counts the gaps
  Dims pad() const { return {p->padding.h, p->padding.w}; }
  dnnl::convolution_forward::primitive_desc forward_pd(const dnnl::engine& eng) const {
    const auto prop = dnnl::prop_kind::forward_training;
    const auto alg = dnnl::algorithm::convolution_direct;
    if (bias)
      return {dnnl::convolution_forward::desc(prop, alg, any(src()), any(wei()), bia(), any(dst()), strides(), dilates(), pad(), pad()),
              eng};
    return {dnnl::convolution_forward::desc(prop, alg, any(src()), any(wei()), any(dst()), strides(), dilates(), pad(), pad()), eng};
  }
};

Entry make_entry(const Problem& pr, Kind k, const dnnl::engine& eng) {
  Entry e;
  try {
    const auto fwd = pr.forward_pd(eng);
    const auto alg = dnnl::algorithm::convolution_direct;
    const memory::desc src = pr.any(pr.src()), wei = pr.any(pr.wei()), dst = pr.any(pr.dst());
    if (k == kForward) {
      e.prim = std::make_shared<dnnl::convolution_forward>(fwd);
      e.src.bind(eng, pr.src(), fwd.src_desc(), true);
      e.wei.bind(eng, pr.wei(), fwd.weights_desc(), true);
      e.dst.bind(eng, pr.dst(), fwd.dst_desc(), false);
    } else if (k == kBackwardData) {
      const dnnl::convolution_backward_data::primitive_desc pd(
          dnnl::convolution_backward_data::desc(alg, src, wei, dst, pr.strides(), pr.dilates(), pr.pad(), pr.pad()), eng, fwd);
      e.prim = std::make_shared<dnnl::convolution_backward_data>(pd);
      e.src.bind(eng, pr.src(), pd.diff_src_desc(), false);
      e.wei.bind(eng, pr.wei(), pd.weights_desc(), true);
      e.dst.bind(eng, pr.dst(), pd.diff_dst_desc(), true);
    } else {
      using BW = dnnl::convolution_backward_weights;
      const BW::primitive_desc pd =
          pr.bias ? BW::primitive_desc(BW::desc(alg, src, wei, pr.bia(), dst, pr.strides(), pr.dilates(), pr.pad(), pr.pad()), eng, fwd)
                  : BW::primitive_desc(BW::desc(alg, src, wei, dst, pr.strides(), pr.dilates(), pr.pad(), pr.pad()), eng, fwd);
      e.prim = std::make_shared<BW>(pd);
      e.src.bind(eng, pr.src(), pd.src_desc(), true);
      e.wei.bind(eng, pr.wei(), pd.diff_weights_desc(), false);
      e.dst.bind(eng, pr.dst(), pd.diff_dst_desc(), true);
    }
    if (pr.bias) e.bias.bind(eng, pr.bia(), pr.bia(), k == kForward);
  } catch (const dnnl::error&) {
    e.prim = nullptr;
  }
  return e;
}

// Runs kind k on the given buffers (src/wei/bias/dst in the forward's naming); false when declined.
bool run(const Problem& pr, Kind k, const float* src, const float* wei, const float* bias, const float* dst) {
  ConvThread& t = thread_state();
  std::vector<int64_t> key = pr.key(k);
  auto it = t.cache.find(key);
  if (it == t.cache.end()) {
    if (t.cache.size() > 256) t.cache.clear();
    it = t.cache.emplace(std::move(key), make_entry(pr, k, t.eng)).first;
  }
  Entry& e = it->second;
  if (!e.prim) return false;
  e.src.user.set_data_handle(const_cast<float*>(src));
  e.wei.user.set_data_handle(const_cast<float*>(wei));
  e.dst.user.set_data_handle(const_cast<float*>(dst));
  if (pr.bias) e.bias.user.set_data_handle(const_cast<float*>(bias));
  // inputs and outputs of this kind, in the forward's naming
  Arg* const ins[3] = {k == kBackwardData ? nullptr : &e.src, k == kBackwardWeights ? nullptr : &e.wei, k == kForward ? nullptr : &e.dst};
  Arg* const outs[2] = {k == kForward ? &e.dst : k == kBackwardData ? &e.src : &e.wei, nullptr};
  std::unordered_map<int, memory> args;
  if (k == kForward) {
    args = {{DNNL_ARG_SRC, e.src.own}, {DNNL_ARG_WEIGHTS, e.wei.own}, {DNNL_ARG_DST, e.dst.own}};
    if (pr.bias) args.emplace(DNNL_ARG_BIAS, e.bias.own);
  } else if (k == kBackwardData) {
    args = {{DNNL_ARG_DIFF_SRC, e.src.own}, {DNNL_ARG_WEIGHTS, e.wei.own}, {DNNL_ARG_DIFF_DST, e.dst.own}};
  } else {
    args = {{DNNL_ARG_SRC, e.src.own}, {DNNL_ARG_DIFF_WEIGHTS, e.wei.own}, {DNNL_ARG_DIFF_DST, e.dst.own}};
    if (pr.bias) args.emplace(DNNL_ARG_DIFF_BIAS, e.bias.own);
  }
  sync_omp_threads();
  for (Arg* a : ins)
    if (a && a->reorder) a->reorder->execute(t.stream, a->user, a->own);
  e.prim->execute(t.stream, args);
  for (Arg* a : outs)
    if (a && a->reorder) a->reorder->execute(t.stream, a->own, a->user);
  t.stream.wait();
  return true;
}

template <class T> const float* fp(const T& v) { return v.storage.template as<float>() + v.layout.offset; }

}  // namespace

bool Cpu::conv2d_forward(M y, V x, V w, const V* bias, const Conv2dParams& p) {
  if (x.dtype != DType::f32) return false;
  const Problem pr{x.layout.shape, w.layout.shape, y.layout.shape, &p, bias != nullptr};
  return run(pr, kForward, fp(x), fp(w), bias ? fp(*bias) : nullptr, fp(y));
}

bool Cpu::conv2d_backward_input(M dx, V dy, V w, const Conv2dParams& p) {
  if (dy.dtype != DType::f32) return false;
  const Problem pr{dx.layout.shape, w.layout.shape, dy.layout.shape, &p, false};
  return run(pr, kBackwardData, fp(dx), fp(w), nullptr, fp(dy));
}

bool Cpu::conv2d_backward_weight(M dw, M* db, V dy, V x, const Conv2dParams& p) {
  if (dy.dtype != DType::f32) return false;
  const Problem pr{x.layout.shape, dw.layout.shape, dy.layout.shape, &p, db != nullptr};
  return run(pr, kBackwardWeights, fp(x), fp(dw), db ? fp(*db) : nullptr, fp(dy));
}

#else  // no oneDNN: the composite (im2col + BLAS) runs

bool Cpu::conv2d_forward(M, V, V, const V*, const Conv2dParams&) { return false; }
bool Cpu::conv2d_backward_input(M, V, V, const Conv2dParams&) { return false; }
bool Cpu::conv2d_backward_weight(M, M*, V, V, const Conv2dParams&) { return false; }

#endif

}  // namespace kiln
