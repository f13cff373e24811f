// Fused attention (nn::attention -> the Cpu flash kernel) vs the decomposed path
// (nn::attention_decomposed: scores [B, H, T, S], softmax, matmul through autograd ops), forward +
// backward through autograd, f32, causal:
//   MHA:  B = 8, H = 4, d = 64 (d_model 256, 4 heads) at T = 128, 512, 1024
//   Diff: B = 8, h = 4, d = 32, dv = 2d = 64 (d_model 256): O = FA(q1, k1, v) − λ FA(q2, k2, v)
//   MHA_hd (fused only): d_model 256 at head dim 32 / 128 / 64 and T 64..2048 (B 2 from T 1024)
//   DiffNorm (fused only): nn::diff_attention_norm as the d256 diff model runs it (h = 2, d = 64, dv = 128)
//   Softcap: Gemma 2 2B's attention (B = 1, H = 8, Hkv = 4, d = 256, the scores capped at 50) at T = 512,
//            1024, 2048, fused (the cap in the flash pass), decomposed (what Gemma 2 ran before), and
//            fused without the cap (what the cap's row passes cost)
// Counters: saved_MiB = bytes the autograd graph keeps for backward (fused: q, k, v, O, LSE; decomposed:
// q, k, v and the [B, H, T, S] probabilities, which both softmax and the P·V matmul keep), and
// transient_MiB = the largest [B, H, T, S]-sized buffers the decomposed forward allocates
// (scores, scaled scores, masked scores, probabilities: 4 of them).
// Run with KILN_NUM_THREADS set (results in RESULTS.md).
#include <benchmark/benchmark.h>

#include <vector>

#include <kiln/autograd/var.hpp>
#include <kiln/backends/cpu/cpu.hpp>
#include <kiln/nn/attention.hpp>
#include <kiln/nn/diff_attention.hpp>

using namespace kiln;
using T = Tensor<Cpu>;
using V = Var<Cpu>;

namespace {

constexpr int64_t kB = 8, kH = 4;

void set_counters(benchmark::State& st, int64_t Tn, int64_t d, int64_t dv, int attns, bool fused) {
  const double f = 4.0 / (1 << 20);
  const double qkv = static_cast<double>(kB * kH * Tn * (2 * d + dv));
  const double tt = static_cast<double>(kB * kH * Tn * Tn);
  const double o = static_cast<double>(kB * kH * Tn * dv), lse = static_cast<double>(kB * kH * Tn);
  st.counters["saved_MiB"] = attns * (fused ? (qkv + o + lse) : (qkv + tt)) * f;
  st.counters["transient_MiB"] = fused ? 0.0 : 4 * tt * f;
}

void BM_MHA(benchmark::State& st, bool fused) {
  const int64_t Tn = st.range(0), d = 64;
  Generator gen(1);
  V q(T::randn({kB, kH, Tn, d}, DType::f32, &gen), true), k(T::randn({kB, kH, Tn, d}, DType::f32, &gen), true),
      v(T::randn({kB, kH, Tn, d}, DType::f32, &gen), true);
  const T g = T::randn({kB, kH, Tn, d}, DType::f32, &gen);
  for (auto _ : st) {
    const V o = fused ? nn::attention(q, k, v, true, 0) : nn::attention_decomposed(q, k, v, true, 0);
    o.backward(g);
    benchmark::DoNotOptimize(q.grad().storage().get());
    q.zero_grad();
    k.zero_grad();
    v.zero_grad();
  }
  set_counters(st, Tn, d, d, 1, fused);
}

// Fused MHA fwd+bwd at other head dims and lengths (args: T, head dim; H = 256 / head dim heads, so
// d_model 256; causal): the tile products' register blocks at 32, 64, 128 columns, T 64..2048.
void BM_MHA_hd(benchmark::State& st) {
  const int64_t Tn = st.range(0), d = st.range(1), H = 256 / d, B = Tn >= 1024 ? 2 : kB;
  Generator gen(4);
  V q(T::randn({B, H, Tn, d}, DType::f32, &gen), true), k(T::randn({B, H, Tn, d}, DType::f32, &gen), true),
      v(T::randn({B, H, Tn, d}, DType::f32, &gen), true);
  const T g = T::randn({B, H, Tn, d}, DType::f32, &gen);
  for (auto _ : st) {
    const V o = nn::attention(q, k, v, true, 0);
    o.backward(g);
    benchmark::DoNotOptimize(q.grad().storage().get());
    q.zero_grad();
    k.zero_grad();
    v.zero_grad();
  }
}

void BM_Diff(benchmark::State& st, bool fused) {
  const int64_t Tn = st.range(0), d = 32;
  Generator gen(2);
  V q1(T::randn({kB, kH, Tn, d}, DType::f32, &gen), true), k1(T::randn({kB, kH, Tn, d}, DType::f32, &gen), true);
  V q2(T::randn({kB, kH, Tn, d}, DType::f32, &gen), true), k2(T::randn({kB, kH, Tn, d}, DType::f32, &gen), true);
  V v(T::randn({kB, kH, Tn, 2 * d}, DType::f32, &gen), true), lam(T::scalar(0.3), true);
  const T g = T::randn({kB, kH, Tn, 2 * d}, DType::f32, &gen);
  auto att = [&](const V& a, const V& b) { return fused ? nn::attention(a, b, v, true, 0) : nn::attention_decomposed(a, b, v, true, 0); };
  for (auto _ : st) {
    const V o = att(q1, k1) - att(q2, k2) * lam;
    o.backward(g);
    benchmark::DoNotOptimize(q1.grad().storage().get());
    for (V* x : {&q1, &k1, &q2, &k2, &v, &lam}) x->zero_grad();
  }
  set_counters(st, Tn, d, 2 * d, 2, fused);
}

// The d256 diff model's attention (kiln train, attention "diff", n_heads 2): nn::diff_attention_norm,
// the one fused op for both softmax maps and the head-wise norm; B = 8, h = 2, d = 64, dv = 128, causal.
void BM_DiffNorm(benchmark::State& st) {
  const int64_t Tn = st.range(0), h = 2, d = 64, dv = 128;
  Generator gen(5);
  V q(T::randn({kB, h, 2, Tn, d}, DType::f32, &gen), true), k(T::randn({kB, h, 2, Tn, d}, DType::f32, &gen), true);
  V v(T::randn({kB, h, Tn, dv}, DType::f32, &gen), true), lam(T::scalar(0.3), true), w(T::ones({dv}, DType::f32), true);
  const T g = T::randn({kB, h, Tn, dv}, DType::f32, &gen);
  for (auto _ : st) {
    const V o = nn::diff_attention_norm(q, k, v, lam, w, 1e-5, 0.2, true, 0);
    o.backward(g);
    benchmark::DoNotOptimize(q.grad().storage().get());
    for (V* x : {&q, &k, &v, &lam, &w}) x->zero_grad();
  }
}

// Fused MHA fwd+bwd (T 128, d 64) with the operands as the training step hands them over (args: layout,
// cold): layout 1 = q, k, v and dO as [B, H, T, d] views of [B, T, H, d] tensors (the projections'
// outputs, rows 1 KiB apart, heads interleaved), 0 = contiguous [B, H, T, d] as BM_MHA; cold 1 = a
// 64 MiB buffer is written between iterations (untimed), so the operands come from memory as they do
// after the rest of a training step, 0 = warm as BM_MHA.
void BM_MHA_layout(benchmark::State& st) {
  const int64_t Tn = 128, d = 64;
  const bool heads_inner = st.range(0) != 0, cold = st.range(1) != 0;
  Generator gen(6);
  auto make = [&](bool grad) {
    return heads_inner ? V(T::randn({kB, Tn, kH, d}, DType::f32, &gen), grad) : V(T::randn({kB, kH, Tn, d}, DType::f32, &gen), grad);
  };
  V q = make(true), k = make(true), v = make(true);
  const T g = heads_inner ? T::randn({kB, Tn, kH, d}, DType::f32, &gen).transpose(1, 2) : T::randn({kB, kH, Tn, d}, DType::f32, &gen);
  std::vector<float> flush(cold ? (64u << 20) / sizeof(float) : 0);
  for (auto _ : st) {
    if (cold) {
      st.PauseTiming();
      for (size_t i = 0; i < flush.size(); i += 16) flush[i] += 1.0f;
      benchmark::ClobberMemory();
      st.ResumeTiming();
    }
    auto view = [&](const V& x) { return heads_inner ? x.transpose(1, 2) : x; };
    const V o = nn::attention(view(q), view(k), view(v), true, 0);
    o.backward(g);
    benchmark::DoNotOptimize(q.grad().storage().get());
    q.zero_grad();
    k.zero_grad();
    v.zero_grad();
  }
}

void BM_Softcap(benchmark::State& st, bool fused, double cap) {
  const int64_t Tn = st.range(0), H = 8, Hkv = 4, d = 256;
  Generator gen(7);
  V q(T::randn({1, H, Tn, d}, DType::f32, &gen), true), k(T::randn({1, Hkv, Tn, d}, DType::f32, &gen), true),
      v(T::randn({1, Hkv, Tn, d}, DType::f32, &gen), true);
  const T g = T::randn({1, H, Tn, d}, DType::f32, &gen);
  for (auto _ : st) {
    const V o = fused ? nn::attention(q, k, v, true, 0, {}, {}, cap) : nn::attention_decomposed(q, k, v, true, 0, {}, {}, cap);
    o.backward(g);
    benchmark::DoNotOptimize(q.grad().storage().get());
    q.zero_grad();
    k.zero_grad();
    v.zero_grad();
  }
}

void BM_MHA_forward(benchmark::State& st, bool fused) {  // inference: no graph
  const int64_t Tn = st.range(0), d = 64;
  Generator gen(3);
  const V q(T::randn({kB, kH, Tn, d}, DType::f32, &gen)), k(T::randn({kB, kH, Tn, d}, DType::f32, &gen)),
      v(T::randn({kB, kH, Tn, d}, DType::f32, &gen));
  NoGrad ng;
  for (auto _ : st) {
    const V o = fused ? nn::attention(q, k, v, true, 0) : nn::attention_decomposed(q, k, v, true, 0);
    benchmark::DoNotOptimize(o.value().storage().get());
  }
}

}  // namespace

BENCHMARK_CAPTURE(BM_MHA, fused, true)->Arg(128)->Arg(512)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_MHA, decomposed, false)->Arg(128)->Arg(512)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_MHA_hd)->Args({64, 32})->Args({128, 32})->Args({512, 128})->Args({2048, 64})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_Diff, fused, true)->Arg(128)->Arg(512)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_Diff, decomposed, false)->Arg(128)->Arg(512)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_MHA_layout)->Args({0, 0})->Args({1, 0})->Args({0, 1})->Args({1, 1})->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_DiffNorm)->Arg(128)->Arg(512)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_Softcap, fused, true, 50.0)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_Softcap, decomposed, false, 50.0)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_Softcap, fused_nocap, true, 0.0)->Arg(512)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_MHA_forward, fused, true)->Arg(128)->Arg(512)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_MHA_forward, decomposed, false)->Arg(128)->Arg(512)->Arg(1024)->Unit(benchmark::kMillisecond)->UseRealTime();

BENCHMARK_MAIN();
