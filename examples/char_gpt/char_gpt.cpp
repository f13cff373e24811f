// A character-level GPT trained from C++ with kiln::fit (not train_gpt): CharTokenizer, TokenData
// batches as IndexedBatches, nn::GPT, AdamW on decay groups, a cosine schedule with warmup,
// gradient clipping, the progress bar, a held-out loss, and sampling with GPT::generate.
//
//   example_char_gpt [corpus.txt] [steps]
//     corpus.txt  default (or ""): Debian's fortunes corpus (package `fortunes`), assembled like
//                 scripts/train_demo.sh does: the plain-text files of /usr/share/games/fortunes,
//                 '%' separator lines blanked, only tab, newline and printable ASCII kept
//     steps       default 200 (a minute or two on 2 cores)
// (model.json/train.json beside this file configure the CLI demo, scripts/train_demo.sh.)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <kiln/autograd/var.hpp>
#include <kiln/backends/backends.hpp>
#include <kiln/nn/gpt.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/optim/optimizer.hpp>
#include <kiln/optim/schedule.hpp>
#include <kiln/train/data.hpp>
#include <kiln/train/loop.hpp>
#include <kiln/train/text.hpp>

using namespace kiln;

template <Backend B> int run(const std::string& text, int64_t steps) {
  // Tokens: the corpus's own alphabet; the last 5% held out.
  const CharTokenizer tok = CharTokenizer::fit(text);
  const std::vector<int64_t> ids = tok.encode(text);
  const auto split = static_cast<std::ptrdiff_t>(static_cast<double>(ids.size()) * 0.95);
  const TokenData train_data(std::vector<int64_t>(ids.begin(), ids.begin() + split), "train");
  const TokenData eval_data(std::vector<int64_t>(ids.begin() + split, ids.end()), "eval");
  fmt::print("corpus: {} characters, vocabulary {}\n", ids.size(), tok.vocab_size());

  // The model, from a config written in code.
  ModelConfig cfg;
  cfg.vocab_size = tok.vocab_size();
  cfg.d_model = 128;
  cfg.n_layers = 4;
  cfg.n_heads = 4;
  cfg.max_seq_len = 128;
  cfg.rope = true;
  cfg.tie_embeddings = true;
  nn::GPT<B> model(cfg.resolved());
  model.init_weights(/*seed=*/0);
  fmt::print("model: {} parameters\n", model.num_parameters());

  // AdamW: weight decay on matrices only (decay_groups), cosine schedule with warmup, clipping at 1.
  const int64_t batch = 16, seq = 64;
  const double peak_lr = 3e-3;
  optim::Adam<B> opt(optim::decay_groups(model.named_parameters(), peak_lr, 0.1),
                     {.lr = peak_lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1, .decoupled = true});

  // Batch i of the token data is a pure function of i, so the step is the data position. The
  // held-out loss: 8 batches of the eval split, after the last step.
  const IndexedBatches train{.batch = [&](int64_t i) { return train_data.batch<B>(i, batch, seq); }};
  const IndexedBatches eval{.batch = [&](int64_t i) { return eval_data.batch<B>(i, batch, seq); }, .count = 8};
  auto step = [&](const std::pair<Tensor<B>, Tensor<B>>& b) {  // x, y: i64 [batch, seq]
    const Var<B> logits = model(b.first);                      // [batch, seq, vocab]
    return StepOutput<B>{.loss = nn::cross_entropy(logits.reshape({-1, cfg.vocab_size}), b.second.reshape({-1})), .tokens = batch * seq};
  };
  const FitResult r = fit(model, opt, train, eval, step,
                          {.steps = steps,
                           .grad_clip = 1.0,
                           .schedule = {.name = "cosine", .warmup_steps = std::min<int64_t>(20, steps / 5), .min_lr_ratio = 0.1}});
  fmt::print("held-out loss {:.4f}\n", r.eval_losses.back());

  const std::vector<int64_t> sample =
      model.generate(tok.encode("The "), {.max_new_tokens = 300, .temperature = 0.8, .top_k = 40, .seed = 1});
  fmt::print("--- sample (temperature 0.8, top-k 40) ---\nThe {}\n", tok.decode(sample));
  return 0;
}

int main(int argc, char** argv) {
  try {
    const bool given = argc > 1 && argv[1][0] != '\0';  // "" also means the default corpus
    const std::string text = given ? read_text_file(argv[1]) : fortunes_corpus("/usr/share/games/fortunes");
    const int64_t steps = argc > 2 ? std::atoll(argv[2]) : 200;
    KILN_CHECK(steps > 0, "char_gpt: steps must be a positive integer, got '{}'", argc > 2 ? argv[2] : "");
    return run<Cpu>(text, steps);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
