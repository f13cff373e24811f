#pragma once
// Text generation for causal language models: kiln's GPT (nn/gpt.hpp) and imported Hugging Face
// models (nn/hf/causal_lm.hpp). A KV cache per layer: the prompt is read in one forward pass
// (prefill), then one token per pass (decode).
//
// Choosing a token follows transformers' generate(): the repetition penalty first (on every id of the
// prompt and of what was generated: a positive logit divided by it, a negative one multiplied), then
// greedy (temperature 0: the largest logit, the lowest id on a tie) or sampling: logits / temperature,
// top-k (ties with the k-th kept), top-p (the smallest set of most likely tokens whose probability
// reaches p, at least one), softmax, one draw from a generator seeded with `seed`.
// A sequence ends after max_new_tokens or on a stop id (EOS), which is kept as its last token.
// Prompts of different lengths run one after the other, each with its own caches (no padding, so
// each sequence gets exactly the tokens it would get alone).
#include <cstdint>
#include <functional>
#include <vector>

#include "kiln/nn/gpt.hpp"
#include "kiln/nn/hf/causal_lm.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::nn {

struct GenerateOptions {
  int64_t max_new_tokens = 20;
  double temperature = 0.0;         // 0: greedy; > 0: sample
  int64_t top_k = 0;                // 0: every token
  double top_p = 1.0;               // 1: every token
  double repetition_penalty = 1.0;  // 1: none (transformers' RepetitionPenaltyLogitsProcessor)
  uint64_t seed = 0;
  int64_t vocab_limit = 0;          // > 0: only ids below it (a tokenizer smaller than the model's vocabulary)
  std::vector<int64_t> stop_ids{};  // end a sequence (the model's EOS ids, and any others)
  // Streaming: called with (sequence index, id) as each token is chosen.
  std::function<void(size_t, int64_t)> on_token{};
};

struct GenerateStats {
  int64_t prefill_tokens = 0, decode_tokens = 0;  // prompt tokens read; tokens from decode passes
  double prefill_seconds = 0, decode_seconds = 0;
  double prefill_tokens_per_second() const { return prefill_seconds > 0 ? static_cast<double>(prefill_tokens) / prefill_seconds : 0; }
  double decode_tokens_per_second() const { return decode_seconds > 0 ? static_cast<double>(decode_tokens) / decode_seconds : 0; }
};

struct Generation {
  std::vector<std::vector<int64_t>> ids;  // per prompt: the generated ids (not the prompt)
  GenerateStats stats;
};

// The logits processors above, in place, on one row of logits; removed tokens become -inf.
// `context`: the ids so far (prompt and generated), for the repetition penalty.
void process_logits(std::vector<float>& logits, const std::vector<int64_t>& context, const GenerateOptions& o);

template <Backend B>
KILN_API Generation generate(const hf::CausalLM<B>& model, const std::vector<std::vector<int64_t>>& prompts, const GenerateOptions& o);
// kiln's GPT: prompt + max_new_tokens must fit max_seq_len (its KV caches' capacity).
template <Backend B>
KILN_API Generation generate(const GPT<B>& model, const std::vector<std::vector<int64_t>>& prompts, const GenerateOptions& o);

}  // namespace kiln::nn
#pragma GCC visibility pop
