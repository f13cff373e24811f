// Attention Residuals and differential attention in the GPT, on the Cpu backend: what each costs
// against the standard residual / MHA at the same size, in training and in generation.
//
//   attnres_bench [--steps N] [--new-tokens N] [--variants mha,diff+attnres_block,...]
//
// For every variant (attention x residual; block size 2 and 4 for attnres_block), one child process
// (so that each peak RSS is its own) builds the GPT of bench/train_vs_ref.py (d_model 256, 4 layers,
// 4 heads (diff: 2), vocab 256, T 128, B 8, f32, seed 0) and measures
//   * train ms: median over N steps of one AdamW training step (forward, cross-entropy, backward,
//     step), after 2 warm-up steps;
//   * peak RSS of the training process;
//   * gen ms/token: greedy generation of --new-tokens tokens after a 16-token prompt with the KV
//     cache, best of 3 (two-phase inference for AttnRes; "seq" = the same with two-phase turned off).
// The whole list runs --rounds times (default 3), variants interleaved, and each figure is the best
// round's: the machine's noise moves single runs by up to 10%.
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
#include <string>
#include <vector>

#include "backends/cpu/cpu.hpp"
#include "nn/gpt.hpp"
#include "nn/loss.hpp"
#include "optim/optimizer.hpp"

using namespace kiln;

namespace {

struct Result {
  double train_ms = 0, gen_ms = 0, gen_seq_ms = 0, rss_mib = 0;
};

double now_ms() {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

ModelConfig config_for(const std::string& variant) {
  ModelConfig c;
  c.vocab_size = 256;
  c.d_model = 256;
  c.n_layers = 4;
  c.max_seq_len = 128;
  const auto plus = variant.find('+');
  c.attention = variant.substr(0, plus);
  c.n_heads = c.attention == "diff" ? 2 : 4;
  std::string res = plus == std::string::npos ? "standard" : variant.substr(plus + 1);
  if (res.rfind("attnres_block", 0) == 0) {
    c.attnres_block_size = res.size() > 13 ? std::stoll(res.substr(14)) : 4;  // attnres_block:S
    res = "attnres_block";
  }
  c.residual = res;
  return c.resolved();
}

// Runs in the child: fills r (training, then generation).
void measure(const std::string& variant, int steps, int new_tokens, Result& r) {
  const ModelConfig c = config_for(variant);
  nn::GPT<Cpu> model(c);
  model.init_weights(0);
  optim::Adam<Cpu> opt(model.named_parameters(), {.lr = 1e-3, .weight_decay = 0.1});
  const int64_t B = 8, T = 128;
  Generator g(1);
  const Tensor<Cpu> ids = Tensor<Cpu>::uniform({B, T + 1}, 0.0, static_cast<double>(c.vocab_size), DType::f64, &g).to(DType::i64);
  const Tensor<Cpu> x = ids.narrow(1, 0, T).contiguous(), y = ids.narrow(1, 1, T).contiguous();
  std::vector<double> ms;
  for (int s = 0; s < steps + 2; ++s) {
    const double t0 = now_ms();
    opt.zero_grad();
    const Var<Cpu> loss = nn::cross_entropy(model(x).reshape({-1, c.vocab_size}), y.reshape({-1}));
    loss.backward();
    opt.step();
    if (s >= 2) ms.push_back(now_ms() - t0);
  }
  std::sort(ms.begin(), ms.end());
  r.train_ms = ms[ms.size() / 2];
  const std::vector<int64_t> prompt(16, 7);
  const nn::SampleOptions so{.max_new_tokens = new_tokens, .temperature = 0.0, .top_k = 0, .seed = 0};
  for (const bool two_phase : {true, false}) {
    model.set_two_phase(two_phase);
    (void)model.generate(prompt, {.max_new_tokens = 4, .temperature = 0.0});  // warm-up
    double best = 1e300;
    for (int rep = 0; rep < 3; ++rep) {
      const double t0 = now_ms();
      (void)model.generate(prompt, so);
      best = std::min(best, (now_ms() - t0) / new_tokens);
    }
    (two_phase ? r.gen_ms : r.gen_seq_ms) = best;
  }
}

Result run_child(const std::string& variant, int steps, int new_tokens) {
  int fd[2];
  if (pipe(fd) != 0) std::exit(1);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fd[0]);
    Result r;
    try {
      measure(variant, steps, new_tokens, r);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: %s\n", variant.c_str(), e.what());
      _exit(2);
    }
    if (write(fd[1], &r, sizeof r) != static_cast<ssize_t>(sizeof r)) _exit(3);
    _exit(0);
  }
  close(fd[1]);
  Result r;
  const bool got = read(fd[0], &r, sizeof r) == static_cast<ssize_t>(sizeof r);
  close(fd[0]);
  int status = 0;
  rusage ru{};
  wait4(pid, &status, 0, &ru);
  if (!got || status != 0) {
    std::fprintf(stderr, "attnres_bench: variant %s failed\n", variant.c_str());
    std::exit(1);
  }
  r.rss_mib = static_cast<double>(ru.ru_maxrss) / 1024.0;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 10, new_tokens = 112, rounds = 3;
  std::string variants =
      "mha,mha+attnres_block:2,mha+attnres_block:4,mha+attnres_full,diff,diff+attnres_block:2,diff+attnres_block:4,diff+attnres_full";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--steps")) steps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--new-tokens")) new_tokens = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--variants")) variants = argv[i + 1];
    else if (!std::strcmp(argv[i], "--rounds")) rounds = std::max(1, std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "attnres_bench: unknown flag %s (valid: --steps, --new-tokens, --variants, --rounds)\n", argv[i]);
      return 2;
    }
  }
  std::vector<std::string> list;
  for (size_t start = 0; start <= variants.size();) {
    const size_t end = std::min(variants.find(',', start), variants.size());
    if (end > start) list.push_back(variants.substr(start, end - start));
    start = end + 1;
  }
  std::map<std::string, Result> best;
  for (int round = 0; round < rounds; ++round)
    for (const std::string& v : list) {
      const Result r = run_child(v, steps, new_tokens);
      auto [it, fresh] = best.emplace(v, r);
      if (!fresh) {
        Result& b = it->second;
        b.train_ms = std::min(b.train_ms, r.train_ms);
        b.gen_ms = std::min(b.gen_ms, r.gen_ms);
        b.gen_seq_ms = std::min(b.gen_seq_ms, r.gen_seq_ms);
        b.rss_mib = std::max(b.rss_mib, r.rss_mib);
      }
      std::fprintf(stderr, "round %d: %s done\n", round + 1, v.c_str());
    }
  std::printf("threads %d, %d training steps (median), %d generated tokens (best of 3), best of %d rounds\n\n", num_threads(), steps,
              new_tokens, rounds);
  std::printf("| variant | train ms | vs standard | vs mha | peak RSS MiB | gen ms/token | vs standard | seq ms/token |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  const auto ratio = [](double a, double b) { return b > 0 ? fmt::format("{:.2f}x", a / b) : std::string("-"); };
  for (const std::string& v : list) {
    const Result& r = best.at(v);
    const std::string att = v.substr(0, v.find('+'));
    const Result s = best.count(att) ? best.at(att) : Result{};
    const Result m = best.count("mha") ? best.at("mha") : Result{};
    const std::string seq = v.find("attnres") == std::string::npos ? std::string("-") : fmt::format("{:.3f}", r.gen_seq_ms);
    std::printf("| %s | %.1f | %s | %s | %.0f | %.3f | %s | %s |\n", v.c_str(), r.train_ms, ratio(r.train_ms, s.train_ms).c_str(),
                ratio(r.train_ms, m.train_ms).c_str(), r.rss_mib, r.gen_ms, ratio(r.gen_ms, s.gen_ms).c_str(), seq.c_str());
  }
}
