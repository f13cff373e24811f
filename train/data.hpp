#pragma once
// The token dataset of docs/specs.md §4: one integer tensor `tokens` [N] from a safetensors file. Batch
// `step` row r starts at ((step·B + r)·T) mod (N − T); inputs are T tokens from there, targets the
// same shifted by one. Deterministic in the step, so a resumed run reads exactly what it would have.
//
// shuffle(seed) (train.json "shuffle", kiln's own): row j = step·B + r instead reads window
// perm_e(j mod W) of epoch e = j div W, where the W = ⌊(N − T)/T⌋ windows of epoch e start at o_e +
// k·T (o_e in [0, T) drawn per epoch) and perm_e is a seeded bijection of [0, W): every epoch reads
// every window once, in an order and at an offset of its own. Still a pure function of the step.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/tensor.hpp"
#include "kiln/text/tokenizer.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

class TokenData {
 public:
  TokenData() = default;
  explicit TokenData(std::vector<int64_t> tokens, std::string source = "tokens") : tokens_(std::move(tokens)), source_(std::move(source)) {}
  // Reads tensor `name` (any integer dtype, rank 1) from a safetensors file.
  static TokenData load(const std::string& path, const std::string& name = "tokens");
  // `kiln train --data`: a token file (*.safetensors, as load), or a text file encoded whole with
  // `tokenizer` (BOS/EOS as its post-processor adds them). A text file without a tokenizer is an error
  // naming the file.
  static TokenData load_or_tokenize(const std::string& path, const text::Tokenizer* tokenizer);

  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  const std::vector<int64_t>& tokens() const { return tokens_; }
  int64_t max_token() const;
  // Checks every token is in [0, vocab); throws naming the file, the token and its position.
  void check_vocab(int64_t vocab) const;

  // Rows read shuffled windows from now on (see above); the same seed gives the same order.
  void shuffle(uint64_t seed) {
    shuffled_ = true;
    seed_ = seed;
  }
  bool shuffled() const { return shuffled_; }
  // Where row j (= step·batch_size + r) of a run with rows of seq_len tokens starts.
  int64_t row_start(int64_t j, int64_t seq_len) const;

  // (inputs, targets), both i64 [B, T].
  template <Backend B> std::pair<Tensor<B>, Tensor<B>> batch(int64_t step, int64_t batch_size, int64_t seq_len) const {
    return rows<B>(step, batch_size, seq_len, 0, batch_size);
  }
  // Rows [first, first + count) of that batch, [count, T] each (a data-parallel rank's share).
  template <Backend B>
  std::pair<Tensor<B>, Tensor<B>> rows(int64_t step, int64_t batch_size, int64_t seq_len, int64_t first, int64_t count) const {
    const int64_t N = size();
    KILN_CHECK(N > seq_len, "batch: '{}' has {} tokens; need more than seq_len={}", source_, N, seq_len);
    KILN_CHECK(first >= 0 && count >= 0 && first + count <= batch_size, "batch: rows [{}, {}) of a batch of {}", first, first + count,
               batch_size);
    std::vector<int64_t> x(static_cast<size_t>(count * seq_len)), y(x.size());
    for (int64_t i = 0; i < count; ++i) {
      const int64_t r = first + i;
      const int64_t start = row_start(step * batch_size + r, seq_len);
      for (int64_t t = 0; t < seq_len; ++t) {
        x[static_cast<size_t>(i * seq_len + t)] = tokens_[static_cast<size_t>(start + t)];
        y[static_cast<size_t>(i * seq_len + t)] = tokens_[static_cast<size_t>(start + t + 1)];
      }
    }
    return {Tensor<B>::from_vector(x, {count, seq_len}), Tensor<B>::from_vector(y, {count, seq_len})};
  }

 private:
  std::vector<int64_t> tokens_;
  std::string source_;
  bool shuffled_ = false;
  uint64_t seed_ = 0;
};

// `kiln train --tokenizer PATH`: the tokenizer (nullopt for an empty path), checked to fit a model with
// `model_vocab` embedding rows: its vocab_size() (the model vocabulary and the added tokens) must not
// exceed them (models often pad their embedding beyond the tokenizer's ids).
std::optional<text::Tokenizer> training_tokenizer(const std::string& path, int64_t model_vocab);

}  // namespace kiln
#pragma GCC visibility pop
