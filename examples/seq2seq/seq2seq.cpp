// Sequence to sequence with an encoder, a decoder and cross-attention: reverse strings of 1 to 12
// digits, padded to a common length. The encoder reads the digits (bidirectional self-attention with
// key padding); the decoder writes them back to front (causal self-attention, cross-attention to the
// encoder with the source's key padding), greedily, one token per step, with a KV cache. Trained with
// kiln::fit; the accuracy is exact match (every digit and the end token) on held-out strings that
// training never sees.
//
//   example_seq2seq [mha|diff] [steps] [min_accuracy]
//     mha|diff      the attention of every layer: MultiHeadAttention or DifferentialAttention (default mha)
//     steps         optimizer steps of 64 strings (default 3000)
//     min_accuracy  exit with status 1 when the held-out exact-match accuracy is below it (default 0)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <kiln/backends/backends.hpp>
#include <kiln/nn/embedding.hpp>
#include <kiln/nn/linear.hpp>
#include <kiln/nn/loss.hpp>
#include <kiln/nn/transformer.hpp>
#include <kiln/optim/optimizer.hpp>
#include <kiln/train/loop.hpp>

using namespace kiln;

namespace {

// Tokens: padding, begin, end, then the digits 0..9.
constexpr int64_t kPad = 0, kBos = 1, kEos = 2, kDigit0 = 3, kVocab = 13;
constexpr int64_t kMaxLen = 12;           // digits in a string
constexpr int64_t kTgtLen = kMaxLen + 1;  // decoder input: BOS + digits; target: digits + EOS

using Digits = std::vector<int64_t>;

// Held out: the strings of 3 or more digits whose hash is 0 mod 10. Training never draws one; the
// test set is made of them only. (Every string of 1 or 2 digits is seen in training: there are 110.)
bool held_out(const Digits& s) {
  if (s.size() < 3) return false;
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (const int64_t d : s) h = (h ^ static_cast<uint64_t>(d + 1)) * 1099511628211ull;
  return h % 10 == 0;
}

Digits draw(std::mt19937_64& rng) {
  const int64_t len = std::uniform_int_distribution<int64_t>(1, kMaxLen)(rng);
  Digits s(static_cast<size_t>(len));
  for (auto& d : s) d = std::uniform_int_distribution<int64_t>(0, 9)(rng);
  return s;
}

// A batch: src i64 [n, kMaxLen] (padded), src_real bool [n, kMaxLen], tgt_in i64 [n, kTgtLen]
// (BOS then the reversed digits, padded), tgt_out i64 [n, kTgtLen] (the reversed digits then EOS;
// -100, ignored by the loss, after it).
template <Backend B> struct Batch {
  Tensor<B> src, src_real, tgt_in, tgt_out;
  std::vector<Digits> strings;
};

template <Backend B> Batch<B> make_batch(const std::vector<Digits>& strings) {
  const auto n = static_cast<int64_t>(strings.size());
  std::vector<int64_t> src(static_cast<size_t>(n * kMaxLen), kPad), tin(static_cast<size_t>(n * kTgtLen), kPad),
      tout(static_cast<size_t>(n * kTgtLen), -100);
  std::vector<int64_t> real(static_cast<size_t>(n * kMaxLen), 0);
  for (int64_t i = 0; i < n; ++i) {
    const Digits& s = strings[static_cast<size_t>(i)];
    const auto len = static_cast<int64_t>(s.size());
    tin[static_cast<size_t>(i * kTgtLen)] = kBos;
    for (int64_t j = 0; j < len; ++j) {
      src[static_cast<size_t>(i * kMaxLen + j)] = kDigit0 + s[static_cast<size_t>(j)];
      real[static_cast<size_t>(i * kMaxLen + j)] = 1;
      const int64_t rev = kDigit0 + s[static_cast<size_t>(len - 1 - j)];
      tin[static_cast<size_t>(i * kTgtLen + j + 1)] = rev;
      tout[static_cast<size_t>(i * kTgtLen + j)] = rev;
    }
    tout[static_cast<size_t>(i * kTgtLen + len)] = kEos;
  }
  return {Tensor<B>::from_vector(src, {n, kMaxLen}), Tensor<B>::from_vector(real, {n, kMaxLen}).to(DType::boolean),
          Tensor<B>::from_vector(tin, {n, kTgtLen}), Tensor<B>::from_vector(tout, {n, kTgtLen}), strings};
}

// Token and learned position embeddings, an encoder and a decoder of pre-norm layers, a head.
template <Backend B> class Seq2Seq : public nn::Module<B> {
 public:
  Seq2Seq(nn::AttentionKind kind, int64_t d_model, int64_t layers) : d_(d_model) {
    using namespace nn;
    src_embed_ = this->register_module("src_embed", std::make_shared<Embedding<B>>(EmbeddingOptions{.num = kVocab, .dim = d_model}));
    tgt_embed_ = this->register_module("tgt_embed", std::make_shared<Embedding<B>>(EmbeddingOptions{.num = kVocab, .dim = d_model}));
    pos_embed_ = this->register_module("pos_embed", std::make_shared<Embedding<B>>(EmbeddingOptions{.num = kTgtLen, .dim = d_model}));
    const TransformerLayerOptions layer{.d_model = d_model,
                                        .n_heads = 4,
                                        .dim_feedforward = 4 * d_model,
                                        .dropout = 0.0,
                                        .activation = Activation::gelu,
                                        .norm_first = true,
                                        .attention = kind,
                                        .max_seq_len = kTgtLen};
    encoder_ = this->register_module("encoder", std::make_shared<TransformerEncoder<B>>(
                                                    TransformerStackOptions{.layer = layer, .num_layers = layers, .final_norm = true}));
    decoder_ = this->register_module("decoder", std::make_shared<TransformerDecoder<B>>(
                                                    TransformerStackOptions{.layer = layer, .num_layers = layers, .final_norm = true}));
    head_ = this->register_module("head", std::make_shared<Linear<B>>(LinearOptions{.in = d_model, .out = kVocab, .bias = true}));
  }

  // src [n, S], src_real bool [n, S] -> memory [n, S, D]
  Var<B> encode(const Tensor<B>& src, const Tensor<B>& src_real) const { return encoder_->forward(embed(*src_embed_, src, 0), src_real); }
  // tgt [n, T] at positions pos0.. (with a cache: after the cached ones) -> logits [n, T, vocab]
  Var<B> decode(const Tensor<B>& tgt, int64_t pos0, const Var<B>& memory, const Tensor<B>& src_real,
                nn::DecoderCache<B>* cache = nullptr) const {
    const Var<B> h = decoder_->forward(embed(*tgt_embed_, tgt, pos0), memory, {.memory_key_padding = src_real, .cache = cache});
    return head_->forward(h);
  }
  // Greedy decoding with a KV cache: the first string of digits before an end token, per row.
  std::vector<Digits> generate(const Tensor<B>& src, const Tensor<B>& src_real) const {
    NoGrad guard;
    const int64_t n = src.size(0);
    const Var<B> memory = encode(src, src_real);
    nn::DecoderCache<B> cache;
    Tensor<B> tok = Tensor<B>::full({n, 1}, static_cast<double>(kBos), DType::i64);
    std::vector<Digits> out(static_cast<size_t>(n));
    std::vector<bool> done(static_cast<size_t>(n), false);
    for (int64_t t = 0; t < kTgtLen; ++t) {
      tok = decode(tok, t, memory, src_real, &cache).value().argmax(-1);  // [n, 1]
      const std::vector<int64_t> next = tok.template to_vector<int64_t>();
      for (int64_t i = 0; i < n; ++i) {
        const auto u = static_cast<size_t>(i);
        if (done[u]) continue;
        if (next[u] >= kDigit0)
          out[u].push_back(next[u] - kDigit0);
        else
          done[u] = true;  // EOS (or a stray BOS/PAD: ends the string, and then it is wrong)
        if (next[u] != kEos && next[u] < kDigit0) out[u].push_back(-1);
      }
      if (std::all_of(done.begin(), done.end(), [](bool d) { return d; })) break;
    }
    for (int64_t i = 0; i < n; ++i)
      if (!done[static_cast<size_t>(i)]) out[static_cast<size_t>(i)].push_back(-1);  // never ended: wrong
    return out;
  }

 private:
  Var<B> embed(const nn::Embedding<B>& table, const Tensor<B>& ids, int64_t pos0) const {
    const Tensor<B> pos = Tensor<B>::arange(static_cast<double>(pos0), static_cast<double>(pos0 + ids.size(1)));
    return table.forward(ids) + pos_embed_->forward(pos);  // [n, T, D] + [T, D]
  }
  int64_t d_;
  std::shared_ptr<nn::Embedding<B>> src_embed_, tgt_embed_, pos_embed_;
  std::shared_ptr<nn::TransformerEncoder<B>> encoder_;
  std::shared_ptr<nn::TransformerDecoder<B>> decoder_;
  std::shared_ptr<nn::Linear<B>> head_;
};

template <Backend B> int run(nn::AttentionKind kind, int64_t steps, double min_accuracy) {
  manual_seed(0);
  Seq2Seq<B> model(kind, 64, 2);
  const int64_t batch = 64;
  const double peak_lr = 2e-3;
  optim::Adam<B> opt(model.named_parameters(), {.lr = peak_lr, .beta1 = 0.9, .beta2 = 0.98, .weight_decay = 0.01, .decoupled = true});
  fmt::print("seq2seq ({}): reverse 1 to {} digits; {} parameters, {} steps of {} strings\n",
             kind == nn::AttentionKind::mha ? "mha" : "diff", kMaxLen, model.num_parameters(), steps, batch);

  // Batch i: a pure function of i (the step is the data position), never a held-out string.
  auto train_batch = [&](int64_t i) {
    std::mt19937_64 rng(1000003ull * static_cast<uint64_t>(i) + 17);
    std::vector<Digits> s;
    while (static_cast<int64_t>(s.size()) < batch) {
      Digits d = draw(rng);
      if (!held_out(d)) s.push_back(std::move(d));
    }
    return make_batch<B>(s);
  };
  // The test set: 1000 held-out strings (3 to 12 digits), from another generator.
  std::vector<Digits> test;
  for (std::mt19937_64 rng(424242); test.size() < 1000;) {
    Digits d = draw(rng);
    if (held_out(d)) test.push_back(std::move(d));
  }
  auto step = [&](const Batch<B>& b) {
    const Var<B> memory = model.encode(b.src, b.src_real);
    const Var<B> logits = model.decode(b.tgt_in, 0, memory, b.src_real);  // [n, T, vocab]
    return StepOutput<B>{.loss = nn::cross_entropy(logits.reshape({-1, kVocab}), b.tgt_out.reshape({-1})),
                         .samples = b.src.size(0),
                         .tokens = b.src.size(0) * kTgtLen};
  };
  const auto t0 = std::chrono::steady_clock::now();
  fit(model, opt, IndexedBatches{.batch = train_batch}, step,
      {.steps = steps, .grad_clip = 1.0, .lr = peak_lr, .schedule = {.name = "cosine", .warmup_steps = 200, .min_lr_ratio = 0.02}});
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  model.eval();
  int64_t right = 0;
  for (size_t i = 0; i < test.size(); i += 250) {
    const std::vector<Digits> part(test.begin() + static_cast<std::ptrdiff_t>(i),
                                   test.begin() + static_cast<std::ptrdiff_t>(std::min(test.size(), i + 250)));
    const Batch<B> b = make_batch<B>(part);
    const std::vector<Digits> got = model.generate(b.src, b.src_real);
    for (size_t j = 0; j < part.size(); ++j) {
      Digits want(part[j].rbegin(), part[j].rend());
      right += got[j] == want;
      if (i == 0 && j < 3) {
        std::string a, w, g;
        for (const int64_t d : part[j]) a += static_cast<char>('0' + d);
        for (const int64_t d : want) w += static_cast<char>('0' + d);
        for (const int64_t d : got[j]) g += d >= 0 ? static_cast<char>('0' + d) : '?';
        fmt::print("  {} -> {} (want {})\n", a, g, w);
      }
    }
  }
  const double acc = static_cast<double>(right) / static_cast<double>(test.size());
  fmt::print("held-out exact match: {:.2f}% ({} of {}), training {:.1f} s\n", 100 * acc, right, test.size(), secs);
  if (acc < min_accuracy) {
    fmt::print("below the required {:.2f}%\n", 100 * min_accuracy);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string kind = argc > 1 ? argv[1] : "mha";
    KILN_CHECK(kind == "mha" || kind == "diff", "seq2seq: attention must be mha or diff, got '{}'", kind);
    const int64_t steps = argc > 2 ? std::atoll(argv[2]) : 3000;
    KILN_CHECK(steps > 0, "seq2seq: steps must be a positive integer, got '{}'", argc > 2 ? argv[2] : "");
    const double min_accuracy = argc > 3 ? std::atof(argv[3]) : 0.0;
    return run<Cpu>(kind == "mha" ? nn::AttentionKind::mha : nn::AttentionKind::diff, steps, min_accuracy);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
