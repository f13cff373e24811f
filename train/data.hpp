#pragma once
// The token dataset of docs/specs.md §4: one integer tensor `tokens` [N] from a safetensors file. Batch
// `step` row r starts at ((step·B + r)·T) mod (N − T); inputs are T tokens from there, targets the
// same shifted by one. Deterministic in the step, so a resumed run reads exactly what it would have.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/tensor.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

class TokenData {
 public:
  TokenData() = default;
  explicit TokenData(std::vector<int64_t> tokens, std::string source = "tokens")
      : tokens_(std::move(tokens)), source_(std::move(source)) {}
  // Reads tensor `name` (any integer dtype, rank 1) from a safetensors file.
  static TokenData load(const std::string& path, const std::string& name = "tokens");

  int64_t size() const { return static_cast<int64_t>(tokens_.size()); }
  const std::vector<int64_t>& tokens() const { return tokens_; }
  int64_t max_token() const;
  // Checks every token is in [0, vocab); throws naming the file, the token and its position.
  void check_vocab(int64_t vocab) const;

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
      const int64_t start = ((step * batch_size + r) * seq_len) % (N - seq_len);
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
};

}  // namespace kiln
#pragma GCC visibility pop
