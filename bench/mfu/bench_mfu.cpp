// Model FLOP utilisation of a GPT training step on the Cpu backend, against this machine's GEMM rate
// on the model's own matrix products, measured in the same run.
//
//   bench_mfu [--rounds 25] [--models d256,d512] [--attention mha|diff] [--shapes] [--clock wall|cpu] [--cold]
//             [--steps-only] [--compare-matmul blas|onednn]
//
// For each model it lists every GEMM of one training step (nn::gpt_flops counts exactly these FLOPs;
// the program checks that the sums agree):
//   * each Linear (q, k, v, out, gate, up, down per layer; the LM head): forward X·Wᵀ [B·T, in] x
//     [in, out], input gradient dY·W, weight gradient Xᵀ·dY, with the operand layouts autograd uses;
//   * attention, per (batch, head, branch): Q·Kᵀ and P·V forward, dV = Pᵀ·dO, dP = dO·Vᵀ, dQ = dS·K,
//     dK = dSᵀ·Q backward, timed as full T x T products and counted at the causal fraction
//     (T+1)/2T: the work a causal kernel must do at the library's rate (kiln's flash kernel runs
//     them as sgemm tiles);
// and times them three ways, interleaved shape by shape: kiln's Tensor matmul (the path the model
// takes: oneDNN or OpenBLAS by size), raw cblas_sgemm (OpenBLAS; batched products one GEMM per item,
// the items in parallel) and a raw oneDNN matmul primitive. "matmul-only" is the sum over the step,
// "best" takes the fastest of the three per shape. One round = one training step (forward,
// cross-entropy, backward, global-norm clipping, AdamW; what `kiln train` runs) and one pass over
// the GEMM list; the report gives medians over the rounds, so a drift in the machine's speed hits
// the step and its GEMMs alike.
//   step / matmul-only (best): the issue-14 goal is <= 1.25 on d256;
//   MFU vs GEMM rate: achieved model GFLOP/s of the step / GFLOP/s of its GEMMs at the best rate.
// --cold also times kiln's GEMMs with their operands evicted from every cache level before each call
// (a 64 MiB buffer read between calls): in a step, a GEMM's activations and weights were last
// touched an op or a whole pass earlier (the optimizer streams every parameter and its moments between
// one step's backward and the next step's forward), so "matmul-only" measures them in cache, as the
// issue's goal does, and the cold figure bounds what a step's GEMMs cost on operands from memory.
// --steps-only runs the rounds' training steps alone, back to back (no GEMM passes between them), and
// prints their median: with KILN_PROFILE=1 the exit report is then the step's own ops, by time.
// --compare-matmul LIB times the steps alone too, alternating kiln's automatic matmul library choice
// and LIB for every f32 product (set_matmul_library) step by step in one process, A B then B A, so
// the two medians share the machine's drifts (VMs' speed wanders by 10-20% over minutes).
// Run with KILN_NUM_THREADS set and GOMP_SPINCOUNT=1000 (the OpenMP policy `kiln train` sets for itself,
// train/cli/kiln.cpp); results in bench/RESULTS.md.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <kiln/backends/cpu/cpu.hpp>
#include <kiln/nn/gpt.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/optim/optimizer.hpp>

#ifdef KILN_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#endif

using namespace kiln;

namespace {

// --clock cpu: the process's CPU time instead of the wall clock, for KILN_NUM_THREADS=1 runs on a
// shared machine, where the wall clock counts the time other processes hold the core (with more
// threads it also counts their spinning at barriers).
bool g_cpu_clock = false;

double now_ms() {
  if (g_cpu_clock) {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
  }
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// C[batch][M, N] = op(A)[M, K] · op(B)[K, N], run `reps` times per step; FLOPs count `scale` of it.
struct Gemm {
  std::string what;
  int64_t batch, M, N, K;
  bool ta, tb;
  int reps;
  double scale;
  double flops() const { return 2.0 * static_cast<double>(batch * M * N * K) * reps * scale; }
};

struct Model {
  std::string name;
  ModelConfig c;
  int64_t B, T;
};

Model model_named(const std::string& name, const std::string& attention) {
  ModelConfig c;
  c.vocab_size = 256;
  c.attention = attention;
  Model m{name, c, 8, 128};
  if (name == "d256") {
    m.c.d_model = 256, m.c.n_layers = 4, m.c.n_heads = 4;
  } else if (name == "d512") {
    m.c.d_model = 512, m.c.n_layers = 6, m.c.n_heads = 8, m.B = 4, m.T = 256;
  } else {
    std::fprintf(stderr, "bench_mfu: unknown model %s (d256, d512)\n", name.c_str());
    std::exit(2);
  }
  if (attention == "diff") m.c.n_heads /= 2;  // the diff model with the parameters of the mha one
  m.c.max_seq_len = m.T;
  m.c = m.c.resolved();
  return m;
}

std::vector<Gemm> step_gemms(const Model& m) {
  const ModelConfig& c = m.c;
  const int64_t M = m.B * m.T, D = c.d_model, hd = D / c.n_heads, kv = c.n_kv_heads * hd, L = c.n_layers;
  std::vector<Gemm> g;
  auto linear = [&](const std::string& what, int64_t in, int64_t out, int64_t reps) {
    const int r = static_cast<int>(reps);
    g.push_back({what + " fwd", 1, M, out, in, false, true, r, 1.0});  // X · Wᵀ
    g.push_back({what + " dX", 1, M, in, out, false, false, r, 1.0});  // dY · W
    g.push_back({what + " dW", 1, in, out, M, true, false, r, 1.0});   // Xᵀ · dY (autograd's gradient of Wᵀ)
  };
  linear("q_proj", D, D, L);
  linear("k_proj", D, kv, L);
  linear("v_proj", D, kv, L);
  linear("out_proj", D, D, L);
  linear("gate_proj", D, c.ffn_hidden, L);
  linear("up_proj", D, c.ffn_hidden, L);
  linear("down_proj", c.ffn_hidden, D, L);
  linear("lm_head", D, c.vocab_size, 1);
  const bool diff = c.attention == "diff";
  const int64_t dqk = diff ? hd / 2 : hd, dv = hd, T = m.T, bh = m.B * c.n_heads;
  const int reps = static_cast<int>(L * (diff ? 2 : 1));
  const double causal = static_cast<double>(T + 1) / static_cast<double>(2 * T);
  g.push_back({"attn Q·Kᵀ", bh, T, T, dqk, false, true, reps, causal});
  g.push_back({"attn P·V", bh, T, dv, T, false, false, reps, causal});
  g.push_back({"attn dV=Pᵀ·dO", bh, T, dv, T, true, false, reps, causal});
  g.push_back({"attn dP=dO·Vᵀ", bh, T, T, dv, false, true, reps, causal});
  g.push_back({"attn dQ=dS·K", bh, T, dqk, T, false, false, reps, causal});
  g.push_back({"attn dK=dSᵀ·Q", bh, T, dqk, T, true, false, reps, causal});
  return g;
}

// One GEMM shape's operands and its three implementations.
struct Runner {
  Gemm g;
  Tensor<Cpu> a, b, c;  // a, b as stored: [batch, M, K] or, transposed, [batch, K, M]
  std::vector<double> t_kiln, t_blas, t_dnnl, t_cold;
#ifdef KILN_HAVE_ONEDNN
  std::unique_ptr<dnnl::matmul> prim;
  dnnl::memory am, bm, cm;
#endif

  explicit Runner(const Gemm& gm) : g(gm) {
    Generator gen(7);
    const Shape as = g.ta ? Shape{g.batch, g.K, g.M} : Shape{g.batch, g.M, g.K};
    const Shape bs = g.tb ? Shape{g.batch, g.N, g.K} : Shape{g.batch, g.K, g.N};
    a = Tensor<Cpu>::randn(as, DType::f32, &gen);
    b = Tensor<Cpu>::randn(bs, DType::f32, &gen);
    c = Tensor<Cpu>::empty({g.batch, g.M, g.N}, DType::f32);
  }
#ifdef KILN_HAVE_ONEDNN
  void make_dnnl(const dnnl::engine& eng) {
    using dnnl::memory;
    const int64_t M = g.M, N = g.N, K = g.K;
    const memory::desc ad({g.batch, M, K}, memory::data_type::f32, g.ta ? memory::dims{M * K, 1, M} : memory::dims{M * K, K, 1});
    const memory::desc bd({g.batch, K, N}, memory::data_type::f32, g.tb ? memory::dims{K * N, 1, K} : memory::dims{K * N, N, 1});
    const memory::desc cd({g.batch, M, N}, memory::data_type::f32, {M * N, N, 1});
    prim = std::make_unique<dnnl::matmul>(dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, cd), eng));
    am = memory(ad, eng, a.storage()->as<float>());
    bm = memory(bd, eng, b.storage()->as<float>());
    cm = memory(cd, eng, c.storage()->as<float>());
  }
#endif
  // kiln: the Tensor op on the views autograd hands it (2-D when batch is 1, as a Linear's are).
  void kiln_once() const {
    Tensor<Cpu> A = g.ta ? a.transpose(-1, -2) : a, Bm = g.tb ? b.transpose(-1, -2) : b;
    if (g.batch == 1) {
      A = A.select(0, 0);
      Bm = Bm.select(0, 0);
    }
    (void)A.matmul(Bm);
  }
  void blas_once() {
    const float* pa = a.storage()->as<float>();
    const float* pb = b.storage()->as<float>();
    float* pc = c.storage()->as<float>();
    const int M = static_cast<int>(g.M), N = static_cast<int>(g.N), K = static_cast<int>(g.K);
    const int lda = g.ta ? M : K, ldb = g.tb ? K : N;
    const auto TA = g.ta ? CblasTrans : CblasNoTrans, TB = g.tb ? CblasTrans : CblasNoTrans;
    if (g.batch == 1) {
      cblas_sgemm(CblasRowMajor, TA, TB, M, N, K, 1.f, pa, lda, pb, ldb, 0.f, pc, N);
      return;
    }
#pragma omp parallel for num_threads(num_threads())
    for (int64_t i = 0; i < g.batch; ++i)
      cblas_sgemm(CblasRowMajor, TA, TB, M, N, K, 1.f, pa + i * g.M * g.K, lda, pb + i * g.K * g.N, ldb, 0.f, pc + i * g.M * g.N, N);
  }
};

volatile unsigned g_sink = 0;  // keeps --cold's eviction reads

// One untimed call first: each implementation is timed in the same steady state (its operands and
// output in cache), whichever of the three ran before it.
template <class F> double time_reps(int reps, F&& f) {
  f();
  const double t0 = now_ms();
  for (int r = 0; r < reps; ++r) f();
  return now_ms() - t0;
}

// One variant: the model, its optimiser and batch, and the GEMMs of its step.
struct Bench {
  Model m;
  std::unique_ptr<nn::GPT<Cpu>> model;
  std::unique_ptr<optim::Adam<Cpu>> opt;
  std::vector<Var<Cpu>> params;
  Tensor<Cpu> x, y;
  std::vector<std::unique_ptr<Runner>> gemms;
  std::vector<double> step_ms;

  explicit Bench(const Model& mm) : m(mm) {
    model = std::make_unique<nn::GPT<Cpu>>(m.c);
    model->init_weights(0);
    for (auto& [n, p] : model->named_parameters()) params.push_back(p);
    opt = std::make_unique<optim::Adam<Cpu>>(
        model->named_parameters(), optim::AdamOptions{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1, .decoupled = true});
    Generator g(1);
    const Tensor<Cpu> ids = Tensor<Cpu>::uniform({m.B, m.T + 1}, 0.0, static_cast<double>(m.c.vocab_size), DType::f64, &g).to(DType::i64);
    x = ids.narrow(1, 0, m.T).contiguous();
    y = ids.narrow(1, 1, m.T).contiguous();
    for (const Gemm& gm : step_gemms(m)) gemms.push_back(std::make_unique<Runner>(gm));
  }
  // What `kiln train` does per step (train/loop.cpp): forward, mean cross-entropy, backward, the global
  // norm, clipping at 1.0, AdamW.
  double step() {
    const double t0 = now_ms();
    opt->zero_grad();
    for (auto& p : params) p.zero_grad();
    const Var<Cpu> loss = nn::cross_entropy((*model)(x).reshape({-1, m.c.vocab_size}), y.reshape({-1}));
    loss.backward();
    const double norm = optim::grad_norm(params);
    const double coef = std::min(1.0, 1.0 / (norm + 1e-6));
    if (coef < 1.0)
      for (auto& p : params)
        if (Tensor<Cpu> g = p.grad(); g.defined()) g.mul_(coef);
    opt->step();
    return now_ms() - t0;
  }
};

}  // namespace

int main(int argc, char** argv) {
  int rounds = 25;
  std::string models = "d256,d512", attention = "mha";
  bool shapes = false, cold = false, steps_only = false;
  std::string compare;  // --compare-matmul LIB
  for (int i = 1; i < argc; ++i) {
    const bool has = i + 1 < argc;
    if (!std::strcmp(argv[i], "--rounds") && has)
      rounds = std::max(1, std::atoi(argv[++i]));
    else if (!std::strcmp(argv[i], "--models") && has)
      models = argv[++i];
    else if (!std::strcmp(argv[i], "--attention") && has)
      attention = argv[++i];
    else if (!std::strcmp(argv[i], "--shapes"))
      shapes = true;
    else if (!std::strcmp(argv[i], "--cold"))
      cold = true;
    else if (!std::strcmp(argv[i], "--steps-only"))
      steps_only = true;
    else if (!std::strcmp(argv[i], "--compare-matmul") && has && (!std::strcmp(argv[i + 1], "blas") || !std::strcmp(argv[i + 1], "onednn")))
      compare = argv[++i];
    else if (!std::strcmp(argv[i], "--clock") && has && (!std::strcmp(argv[i + 1], "cpu") || !std::strcmp(argv[i + 1], "wall")))
      g_cpu_clock = !std::strcmp(argv[++i], "cpu");
    else {
      std::fprintf(
          stderr,
          "bench_mfu: bad flag %s (valid: --rounds N, --models d256,d512, --attention mha|diff, --shapes, --clock wall|cpu, --cold, "
          "--steps-only, --compare-matmul blas|onednn)\n",
          argv[i]);
      return 2;
    }
  }
  std::vector<std::unique_ptr<Bench>> benches;
  for (size_t s = 0; s <= models.size();) {
    const size_t e = std::min(models.find(',', s), models.size());
    if (e > s) benches.push_back(std::make_unique<Bench>(model_named(models.substr(s, e - s), attention)));
    s = e + 1;
  }
  if (!compare.empty()) {  // A B per step: auto against another matmul library
    for (auto& b : benches) {
      for (const char* lib : {"auto", compare.c_str(), "auto", compare.c_str()}) {  // warm-up: both libraries' first calls
        set_matmul_library(lib);
        (void)b->step();
      }
      std::vector<double> ms[2];
      for (int r = 0; r < rounds; ++r)
        for (int i = 0; i < 2; ++i) {  // A B, then B A
          const int which = (r + i) % 2;
          set_matmul_library(which == 0 ? "auto" : compare);
          ms[which].push_back(b->step());
        }
      std::printf(
          "bench_mfu --compare-matmul %s: %s, %s attention, %d threads: median step auto %.2f ms, %s %.2f ms, "
          "ratio %.3f (%d steps each, alternated; %s)\n",
          compare.c_str(), b->m.name.c_str(), attention.c_str(), num_threads(), median(ms[0]), compare.c_str(), median(ms[1]),
          median(ms[1]) / median(ms[0]), rounds, g_cpu_clock ? "process CPU time" : "wall clock");
    }
    return 0;
  }
  if (steps_only) {
    for (auto& b : benches) {
      for (int w = 0; w < 2; ++w) (void)b->step();  // warm-up: allocator caches, page faults
      for (int r = 0; r < rounds; ++r) b->step_ms.push_back(b->step());
      std::printf("bench_mfu --steps-only: %s, %s attention, %d threads: median step %.2f ms of %d (%s, matmul %s)\n", b->m.name.c_str(),
                  attention.c_str(), num_threads(), median(b->step_ms), rounds, g_cpu_clock ? "process CPU time" : "wall clock",
                  std::string(matmul_library()).c_str());
    }
    return 0;
  }
#ifdef KILN_HAVE_ONEDNN
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  for (auto& b : benches)
    for (auto& r : b->gemms) r->make_dnnl(eng);
#endif
  std::vector<char> evict(cold ? size_t{64} << 20 : 0);
  // The three implementations are timed in an order that rotates with the pass (`turn`): the first of
  // the three after the step or another shape's passes runs slower (about 5% over the d256 GEMMs on an
  // AVX-512 EPYC), which a fixed order charged to one column.
  auto gemm_pass = [&](Bench& b, bool record, int turn) {
    for (auto& r : b.gemms) {
      if (cold) {  // one call at a time after evicting the caches; the eviction is not timed
        double t = 0;
        for (int rep = 0; rep < r->g.reps; ++rep) {
          unsigned sum = 0;  // read, not written: no dirty lines left to write back during the call
          for (size_t i = 0; i < evict.size(); i += 64) sum += static_cast<unsigned char>(evict[i]);
          g_sink = g_sink + sum;
          const double t0 = now_ms();
          r->kiln_once();
          t += now_ms() - t0;
        }
        if (record) r->t_cold.push_back(t * r->g.scale);
      }
      double tk = 0, tb = 0, td = 0;
      for (int j = 0; j < 3; ++j) {
        const int which = (turn + j) % 3;
        if (which == 0) tk = time_reps(r->g.reps, [&] { r->kiln_once(); });
        if (which == 1) tb = time_reps(r->g.reps, [&] { r->blas_once(); });
#ifdef KILN_HAVE_ONEDNN
        if (which == 2)
          td = time_reps(r->g.reps, [&] {
            r->prim->execute(strm, {{DNNL_ARG_SRC, r->am}, {DNNL_ARG_WEIGHTS, r->bm}, {DNNL_ARG_DST, r->cm}});
            strm.wait();
          });
#endif
      }
      if (record) {
        r->t_kiln.push_back(tk * r->g.scale);
        r->t_blas.push_back(tb * r->g.scale);
        r->t_dnnl.push_back(td * r->g.scale);
      }
    }
  };
  for (int w = 0; w < 2; ++w)  // warm-up: allocator caches, oneDNN primitives, page faults
    for (auto& b : benches) {
      (void)b->step();
      gemm_pass(*b, false, w);
    }
  for (int r = 0; r < rounds; ++r)
    for (auto& b : benches) {
      b->step_ms.push_back(b->step());
      gemm_pass(*b, true, r);
    }

  std::printf(
      "bench_mfu: %s attention, %d threads, medians of %d rounds (one training step + one pass over its GEMMs each, "
      "interleaved), %s, kiln's matmul library %s\n\n",
      attention.c_str(), num_threads(), rounds, g_cpu_clock ? "process CPU time" : "wall clock", std::string(matmul_library()).c_str());
  std::printf(
      "| model | GFLOP/step | step ms | matmul-only ms: kiln / OpenBLAS / oneDNN / best | step ÷ matmul-only (best) | "
      "achieved GFLOP/s | GEMM GFLOP/s (best) | MFU vs GEMM rate |\n|---|---|---|---|---|---|---|---|\n");
  for (auto& b : benches) {
    const nn::GPTFlops f = nn::gpt_flops(b->m.c, b->m.T);
    const double model_flops = f.total() * static_cast<double>(b->m.B);
    double gemm_flops = 0, tk = 0, tb = 0, td = 0, best = 0;
    for (auto& r : b->gemms) {
      gemm_flops += r->g.flops();
      const double k = median(r->t_kiln), o = median(r->t_blas), d = median(r->t_dnnl);
      tk += k, tb += o, td += d;
      best += d > 0 ? std::min({k, o, d}) : std::min(k, o);
    }
    // The GEMM list is the model's matmul work: dense + attention of gpt_flops, exactly.
    const double want = (f.dense + f.attention) * static_cast<double>(b->m.B);
    if (std::abs(gemm_flops - want) > 1e-9 * want) {
      std::fprintf(stderr, "bench_mfu: the GEMM list has %.6g FLOPs, gpt_flops %.6g\n", gemm_flops, want);
      return 1;
    }
    const double step = median(b->step_ms);
    const double achieved = model_flops / step / 1e6, rate = gemm_flops / best / 1e6;
    std::printf("| %s %s (D %lld, L %lld, T %lld, B %lld) | %.3f | %.1f | %.1f / %.1f / %.1f / %.1f | %.2f | %.1f | %.1f | %.0f%% |\n",
                b->m.name.c_str(), attention.c_str(), static_cast<long long>(b->m.c.d_model), static_cast<long long>(b->m.c.n_layers),
                static_cast<long long>(b->m.T), static_cast<long long>(b->m.B), model_flops / 1e9, step, tk, tb, td, best, step / best,
                achieved, rate, 100.0 * achieved / rate);
  }
  if (cold)
    for (auto& b : benches) {
      double hot = 0, cold_ms = 0;
      for (auto& r : b->gemms) hot += median(r->t_kiln), cold_ms += median(r->t_cold);
      const double step = median(b->step_ms);
      std::printf(
          "\n%s: kiln's GEMMs with their operands evicted before each call: %.1f ms per step (in cache: %.1f); step ÷ cold "
          "GEMMs %.2f\n",
          b->m.name.c_str(), cold_ms, hot, step / cold_ms);
    }
  if (shapes)
    for (auto& b : benches) {
      std::printf(
          "\n%s: per GEMM (ms per step, all reps; GFLOP/s)\n| GEMM | batch x M x N x K | reps | kiln | OpenBLAS | oneDNN |\n"
          "|---|---|---|---|---|---|\n",
          b->m.name.c_str());
      for (auto& r : b->gemms) {
        const Gemm& g = r->g;
        const double k = median(r->t_kiln), o = median(r->t_blas), d = median(r->t_dnnl);
        std::printf("| %s | %lld x %lld x %lld x %lld%s%s | %d | %.3f (%.0f) | %.3f (%.0f) | %.3f (%.0f) |\n", g.what.c_str(),
                    static_cast<long long>(g.batch), static_cast<long long>(g.M), static_cast<long long>(g.N), static_cast<long long>(g.K),
                    g.ta ? " Aᵀ" : "", g.tb ? " Bᵀ" : "", g.reps, k, g.flops() / k / 1e6, o, g.flops() / o / 1e6, d,
                    d > 0 ? g.flops() / d / 1e6 : 0.0);
      }
    }
  return 0;
}
