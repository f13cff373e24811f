// Conv2d forward + backward (data, weights, bias) through kiln's autograd against raw oneDNN calls on the
// same shapes, interleaved in one loop (one call of each per iteration, timed separately).
// Peers: oneDNN with the plain layouts the tensors have (nchw / oihw, no reorder), and oneDNN choosing its
// own blocked layouts (format_tag::any) with the reorders a caller holding nchw tensors must pay.
// Reported: kiln's time; counters: each one's GFLOP/s and ratio = fastest peer's time / kiln's (>= 1: kiln faster).
//
//   KILN_NUM_THREADS=2 ./bench_conv            (bench/conv/run.sh builds and runs it)
#include <benchmark/benchmark.h>

#include <chrono>
#include <functional>
#include <optional>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>

#include <kiln/autograd/var.hpp>
#include <kiln/backends/cpu/cpu.hpp>
#include <kiln/nn/conv.hpp>

using namespace kiln;
using C = Tensor<Cpu>;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Interleaved {
  std::vector<double> total;
  int64_t n = 0;
  void run(benchmark::State& state, const std::vector<std::function<void()>>& fns) {
    total.assign(fns.size(), 0.0);
    for (const auto& f : fns) f();  // warm up: primitive creation, page faults
    for (auto _ : state) {
      for (size_t i = 0; i < fns.size(); ++i) {
        const double t0 = now();
        fns[i]();
        const double t = now() - t0;
        total[i] += t;
        if (i == 0) state.SetIterationTime(t);
      }
      ++n;
    }
  }
  double mean(size_t i) const { return total[i] / static_cast<double>(n); }
};

struct Shape2 {
  int64_t N, C, H, W, O, k, stride, pad, groups;
  int64_t Ho() const { return (H + 2 * pad - k) / stride + 1; }
  int64_t Wo() const { return (W + 2 * pad - k) / stride + 1; }
};

// One oneDNN conv forward + backward data + backward weights (with bias) on user nchw buffers.
struct DnnlConv {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream s{eng};
  std::vector<std::function<void()>> steps;
  std::vector<dnnl::memory> keep;

  DnnlConv(const Shape2& c, bool blocked, float* x, float* w, float* b, float* y, float* dy, float* dx, float* dw, float* db) {
    using namespace dnnl;
    using dt = memory::data_type;
    using tag = memory::format_tag;
    const memory::dims xd{c.N, c.C, c.H, c.W}, yd{c.N, c.O, c.Ho(), c.Wo()}, bd{c.O};
    const memory::dims wd =
        c.groups == 1 ? memory::dims{c.O, c.C, c.k, c.k} : memory::dims{c.groups, c.O / c.groups, c.C / c.groups, c.k, c.k};
    const tag wtag = c.groups == 1 ? tag::oihw : tag::goihw;
    const memory::dims st{c.stride, c.stride}, dil{0, 0}, pad{c.pad, c.pad};
    const memory::desc ux(xd, dt::f32, tag::nchw), uy(yd, dt::f32, tag::nchw), uw(wd, dt::f32, wtag), ub(bd, dt::f32, tag::x);
    const memory::desc ax = blocked ? memory::desc(xd, dt::f32, tag::any) : ux, ay = blocked ? memory::desc(yd, dt::f32, tag::any) : uy,
                       aw = blocked ? memory::desc(wd, dt::f32, tag::any) : uw;
    const auto fwd_pd = convolution_forward::primitive_desc(
        convolution_forward::desc(prop_kind::forward_training, algorithm::convolution_direct, ax, aw, ub, ay, st, dil, pad, pad), eng);
    const auto bwd_d_pd = convolution_backward_data::primitive_desc(
        convolution_backward_data::desc(algorithm::convolution_direct, ax, aw, ay, st, dil, pad, pad), eng, fwd_pd);
    const auto bwd_w_pd = convolution_backward_weights::primitive_desc(
        convolution_backward_weights::desc(algorithm::convolution_direct, ax, aw, ub, ay, st, dil, pad, pad), eng, fwd_pd);
    memory mx(ux, eng, x), mw(uw, eng, w), mb(ub, eng, b), my(uy, eng, y), mdy(uy, eng, dy), mdx(ux, eng, dx), mdw(uw, eng, dw),
        mdb(ub, eng, db);
    // a user buffer in the layout a primitive wants: the buffer itself, or a reorder into a scratch one
    auto in = [&](memory user, const memory::desc& want) -> memory {
      if (user.get_desc() == want) return user;
      memory m(want, eng);
      steps.push_back([r = reorder(user, m), user, m, this]() mutable { r.execute(s, user, m); });
      keep.push_back(m);
      return m;
    };
    auto out_then = [&](memory user, const memory::desc& have, std::vector<std::function<void()>>& after) -> memory {
      if (user.get_desc() == have) return user;
      memory m(have, eng);
      after.push_back([r = reorder(m, user), user, m, this]() mutable { r.execute(s, m, user); });
      keep.push_back(m);
      return m;
    };
    std::vector<std::function<void()>> after;
    // forward
    memory fx = in(mx, fwd_pd.src_desc()), fw = in(mw, fwd_pd.weights_desc());
    memory fy = out_then(my, fwd_pd.dst_desc(), after);
    steps.push_back([p = convolution_forward(fwd_pd), fx, fw, mb, fy, this] {
      p.execute(s, {{DNNL_ARG_SRC, fx}, {DNNL_ARG_WEIGHTS, fw}, {DNNL_ARG_BIAS, mb}, {DNNL_ARG_DST, fy}});
    });
    for (auto& a : after) steps.push_back(a);
    after.clear();
    // backward data
    memory gdy = in(mdy, bwd_d_pd.diff_dst_desc()), gw = in(mw, bwd_d_pd.weights_desc());
    memory gdx = out_then(mdx, bwd_d_pd.diff_src_desc(), after);
    steps.push_back([p = convolution_backward_data(bwd_d_pd), gdy, gw, gdx, this] {
      p.execute(s, {{DNNL_ARG_DIFF_DST, gdy}, {DNNL_ARG_WEIGHTS, gw}, {DNNL_ARG_DIFF_SRC, gdx}});
    });
    // backward weights (+ bias)
    memory hx = in(mx, bwd_w_pd.src_desc()), hdy = in(mdy, bwd_w_pd.diff_dst_desc());
    memory hdw = out_then(mdw, bwd_w_pd.diff_weights_desc(), after);
    steps.push_back([p = convolution_backward_weights(bwd_w_pd), hx, hdy, hdw, mdb, this] {
      p.execute(s, {{DNNL_ARG_SRC, hx}, {DNNL_ARG_DIFF_DST, hdy}, {DNNL_ARG_DIFF_WEIGHTS, hdw}, {DNNL_ARG_DIFF_BIAS, mdb}});
    });
    for (auto& a : after) steps.push_back(a);
  }
  void operator()() {
    for (auto& f : steps) f();
    s.wait();
  }
};

// args: N, C, H(=W), O, k, stride, pad, groups
void BM_conv2d_fwd_bwd(benchmark::State& state) {
  const Shape2 c{state.range(0), state.range(1), state.range(2), state.range(2), state.range(3),
                 state.range(4), state.range(5), state.range(6), state.range(7)};
  num_threads();
  const C x = C::randn({c.N, c.C, c.H, c.W}), w = C::randn({c.O, c.C / c.groups, c.k, c.k}).mul(0.1), b = C::randn({c.O});
  const C dy = C::randn({c.N, c.O, c.Ho(), c.Wo()});
  C y = C::empty(dy.shape()), dx = C::empty(x.shape()), dw = C::empty(w.shape()), db = C::empty(b.shape());
  auto f = [](const C& t) { return const_cast<float*>(t.storage()->as<float>()); };

  Var<Cpu> vx(x, true), vw(w, true), vb(b, true);
  auto kiln_fn = [&] {
    vx.zero_grad();
    vw.zero_grad();
    vb.zero_grad();
    const Var<Cpu> out = nn::functional::conv2d(vx, vw, vb, c.stride, c.pad, 1, c.groups);
    out.backward(dy);
  };
  DnnlConv plain(c, false, f(x), f(w), f(b), f(y), f(dy), f(dx), f(dw), f(db));
  DnnlConv blocked(c, true, f(x), f(w), f(b), f(y), f(dy), f(dx), f(dw), f(db));
  Interleaved r;
  r.run(state, {kiln_fn, [&] { plain(); }, [&] { blocked(); }});
  // forward, backward data and backward weights: 3 convolutions' worth of multiply-adds
  const double flop = 3 * 2.0 * static_cast<double>(c.N * c.O * c.Ho() * c.Wo() * (c.C / c.groups) * c.k * c.k);
  state.counters["kiln_GFLOPs"] = flop / r.mean(0) / 1e9;
  state.counters["dnnl_plain_GFLOPs"] = flop / r.mean(1) / 1e9;
  state.counters["dnnl_blocked_GFLOPs"] = flop / r.mean(2) / 1e9;
  state.counters["ratio_vs_best"] = std::min(r.mean(1), r.mean(2)) / r.mean(0);
}

void conv_args(benchmark::internal::Benchmark* b) {
  b->Args({128, 1, 28, 32, 3, 1, 1, 1});     // examples/fashion_mnist_cnn, first conv
  b->Args({128, 32, 14, 64, 3, 1, 1, 1});    // ... second conv
  b->Args({64, 3, 32, 16, 3, 1, 1, 1});      // an RGB first layer
  b->Args({64, 8, 28, 8, 5, 1, 2, 1});       // few channels, 5x5
  b->Args({8, 64, 56, 64, 3, 1, 1, 1});      // a ResNet stage-1 3x3
  b->Args({8, 128, 28, 256, 3, 2, 1, 1});    // a strided 3x3 (downsampling)
  b->Args({8, 256, 14, 256, 1, 1, 0, 1});    // a 1x1 (pointwise)
  b->Args({8, 128, 28, 128, 3, 1, 1, 128});  // depthwise 3x3
  b->ArgNames({"N", "C", "HW", "O", "k", "s", "p", "g"});
}
BENCHMARK(BM_conv2d_fwd_bwd)->Apply(conv_args)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(1.0);

}  // namespace

BENCHMARK_MAIN();
