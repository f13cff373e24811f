// Attention Residuals and differential attention in the GPT, on the Cpu backend: what each costs
// against the standard residual / MHA at the same size, in training and in generation.
//
//   attnres_bench [--steps N] [--new-tokens N] [--gen-rounds N] [--variants mha,diff+attnres_block:2,...]
//                 [--d-model 256] [--layers 4] [--heads 4]      (--steps 0: generation only)
//
// Every variant (attention x residual; block size 2 and 4 for attnres_block) is the GPT of
// bench/train_vs_ref.py (d_model 256, 4 layers, 4 heads (diff: 2), vocab 256, T 128, B 8, f32, seed 0):
//   * train ms: median over --steps rounds of one AdamW training step (forward, cross-entropy,
//     backward, step), after 2 warm-up steps;
//   * gen ms/token: median over --gen-rounds of greedy generation of --new-tokens tokens after a
//     16-token prompt with the KV cache (two-phase inference for AttnRes; "seq" = two-phase off);
//   * peak RSS: a child process per variant that builds it and runs 3 training steps.
// All variants live in one process and the timings interleave them step by step (round r times
// every variant once), so a drift of the machine's speed (other tenants, clocks: single runs move by
// 10-30% here over minutes) hits every variant alike and the ratios stay meaningful.
// Ratios are against the standard residual with the same attention (and, for diff, against mha).
// Run with KILN_NUM_THREADS set; results in bench/RESULTS.md.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <kiln/backends/cpu/cpu.hpp>
#include <kiln/nn/gpt.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/optim/optimizer.hpp>

using namespace kiln;

namespace {

struct Result {
  double train_ms = 0, gen_ms = 0, gen_seq_ms = 0, rss_mib = 0;
};

double now_ms() { return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// The model's size (flags --d-model, --layers, --heads; diff gets half the heads: equal parameters).
int64_t g_d_model = 256, g_layers = 4, g_heads = 4;

ModelConfig config_for(const std::string& variant) {
  ModelConfig c;
  c.vocab_size = 256;
  c.d_model = g_d_model;
  c.n_layers = g_layers;
  c.max_seq_len = 128;
  const auto plus = variant.find('+');
  c.attention = variant.substr(0, plus);
  c.n_heads = c.attention == "diff" ? g_heads / 2 : g_heads;
  std::string res = plus == std::string::npos ? "standard" : variant.substr(plus + 1);
  if (res.rfind("attnres_block", 0) == 0) {
    c.attnres_block_size = res.size() > 13 ? std::stoll(res.substr(14)) : 4;  // attnres_block:S
    res = "attnres_block";
  }
  c.residual = res;
  return c.resolved();
}

// One variant's model, optimiser and batch.
struct Bench {
  std::string name;
  ModelConfig c;
  std::unique_ptr<nn::GPT<Cpu>> model;
  std::unique_ptr<optim::Adam<Cpu>> opt;
  Tensor<Cpu> x, y;
  std::vector<double> train, gen, gen_seq;

  explicit Bench(const std::string& v) : name(v), c(config_for(v)) {
    model = std::make_unique<nn::GPT<Cpu>>(c);
    model->init_weights(0);
    opt = std::make_unique<optim::Adam<Cpu>>(model->named_parameters(),
                                             optim::AdamOptions{.lr = 1e-3, .weight_decay = 0.1, .decoupled = true});  // AdamW
    const int64_t B = 8, T = 128;
    Generator g(1);
    const Tensor<Cpu> ids = Tensor<Cpu>::uniform({B, T + 1}, 0.0, static_cast<double>(c.vocab_size), DType::f64, &g).to(DType::i64);
    x = ids.narrow(1, 0, T).contiguous();
    y = ids.narrow(1, 1, T).contiguous();
  }
  double step() {
    const double t0 = now_ms();
    opt->zero_grad();
    const Var<Cpu> loss = nn::cross_entropy((*model)(x).reshape({-1, c.vocab_size}), y.reshape({-1}));
    loss.backward();
    opt->step();
    return now_ms() - t0;
  }
  double generate(int new_tokens, bool two_phase) {
    model->set_two_phase(two_phase);
    const std::vector<int64_t> prompt(16, 7);
    const double t0 = now_ms();
    (void)model->generate(prompt, {.max_new_tokens = new_tokens, .temperature = 0.0, .top_k = 0, .seed = 0});
    return (now_ms() - t0) / new_tokens;
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Peak RSS of a child that builds the variant and runs 3 training steps.
double peak_rss_mib(const std::string& variant) {
  const pid_t pid = fork();
  if (pid == 0) {
    try {
      Bench b(variant);
      for (int s = 0; s < 3; ++s) (void)b.step();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: %s\n", variant.c_str(), e.what());
      _exit(2);
    }
    _exit(0);
  }
  int status = 0;
  rusage ru{};
  wait4(pid, &status, 0, &ru);
  if (status != 0) {
    std::fprintf(stderr, "attnres_bench: variant %s failed\n", variant.c_str());
    std::exit(1);
  }
  return static_cast<double>(ru.ru_maxrss) / 1024.0;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 15, new_tokens = 32, rounds = 15;
  std::string variants =
      "mha,mha+attnres_block:2,mha+attnres_block:4,mha+attnres_full,diff,diff+attnres_block:2,diff+attnres_block:4,diff+attnres_full";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--steps"))
      steps = std::max(0, std::atoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--d-model"))
      g_d_model = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--layers"))
      g_layers = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--heads"))
      g_heads = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--new-tokens"))
      new_tokens = std::max(1, std::atoi(argv[i + 1]));
    else if (!std::strcmp(argv[i], "--variants"))
      variants = argv[i + 1];
    else if (!std::strcmp(argv[i], "--gen-rounds"))
      rounds = std::max(1, std::atoi(argv[i + 1]));
    else {
      std::fprintf(
          stderr, "attnres_bench: unknown flag %s (valid: --steps, --new-tokens, --gen-rounds, --variants, --d-model, --layers, --heads)\n",
          argv[i]);
      return 2;
    }
  }
  std::vector<std::string> list;
  for (size_t start = 0; start <= variants.size();) {
    const size_t end = std::min(variants.find(',', start), variants.size());
    if (end > start) list.push_back(variants.substr(start, end - start));
    start = end + 1;
  }
  std::map<std::string, double> rss;
  if (steps > 0)
    for (const std::string& v : list) rss[v] = peak_rss_mib(v);
  std::vector<std::unique_ptr<Bench>> benches;
  for (const std::string& v : list) benches.push_back(std::make_unique<Bench>(v));
  for (int w = 0; w < (steps > 0 ? 2 : 0); ++w)  // warm-up
    for (auto& b : benches) (void)b->step();
  for (int s = 0; s < steps; ++s)
    for (auto& b : benches) b->train.push_back(b->step());
  for (auto& b : benches) (void)b->generate(4, true);  // warm-up
  for (int r = 0; r < rounds; ++r)
    for (auto& b : benches)
      for (const bool two_phase : {true, false}) {
        if (!two_phase && b->c.residual == "standard") continue;
        (two_phase ? b->gen : b->gen_seq).push_back(b->generate(new_tokens, two_phase));
      }
  std::printf(
      "d_model %lld, %lld layers, %lld heads; threads %d; medians of %d training steps and of %d generations of %d tokens, "
      "the variants interleaved step by step\n\n",
      static_cast<long long>(g_d_model), static_cast<long long>(g_layers), static_cast<long long>(g_heads), num_threads(), steps, rounds,
      new_tokens);
  std::printf("| variant | train ms | vs standard | vs mha | peak RSS MiB | gen ms/token | vs standard | seq ms/token |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  std::map<std::string, Result> res;
  for (auto& b : benches) res[b->name] = {median(b->train), median(b->gen), median(b->gen_seq), rss[b->name]};
  const auto ratio = [](double a, double b) { return b > 0 ? fmt::format("{:.2f}x", a / b) : std::string("-"); };
  for (const std::string& v : list) {
    const Result& r = res.at(v);
    const std::string att = v.substr(0, v.find('+'));
    const Result s = res.count(att) ? res.at(att) : Result{};
    const Result m = res.count("mha") ? res.at("mha") : Result{};
    const std::string seq = v.find("attnres") == std::string::npos ? std::string("-") : fmt::format("{:.3f}", r.gen_seq_ms);
    std::printf("| %s | %.1f | %s | %s | %.0f | %.3f | %s | %s |\n", v.c_str(), r.train_ms, ratio(r.train_ms, s.train_ms).c_str(),
                ratio(r.train_ms, m.train_ms).c_str(), r.rss_mib, r.gen_ms, ratio(r.gen_ms, s.gen_ms).c_str(), seq.c_str());
  }
}
