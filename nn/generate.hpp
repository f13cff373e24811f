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
// A sequence ends after max_new_tokens, on a stop id (EOS), which is kept as its last token, or when
// its text contains a stop string (stop_strings: needs a detokenizer). Stop strings follow transformers'
// StopStringCriteria for the ids (the token that completes a stop string is the last one kept: ids are
// not split) and llama.cpp / the OpenAI API for the text: Generation::text and on_text end just before
// the stop string (neither it nor what follows it in its last token is given out). Matching runs on the
// generated text only (not the prompt), across token boundaries; streamed text is held back while its
// end could still begin a stop string.
//
// A batch of prompts decodes as one batch per step (batch_size prompts at a time; 0: all of them). A
// batch of prompts of different lengths is left-padded, as transformers' batched generate(): each row
// has its own positions (0 at its first real token) and attends to its own tokens only (a mask hides the
// padding), so each row gets the ids it gets alone (greedy; up to the rounding of a batched matmul).
// Rows end independently (stop id, stop string, max_new_tokens); ended rows leave the batch (their KV
// caches are compacted). Sampling draws each row from its own generator, seeded with seed + its
// index in `prompts`: a prompt gets the same samples alone (with that seed) as in a batch.
// (hf::CausalLM and kiln's GPT take the rows' positions and mask as nn::RowInputs.)
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/nn/gpt.hpp"
#include "kiln/nn/hf/causal_lm.hpp"
#include "kiln/text/tokenizer.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::nn {

// Turns one sequence's ids into text as they come (stop strings, streaming): push returns the text that
// `id` completes (never half a UTF-8 character), finish what is left at the end.
class Detokenizer {
 public:
  virtual ~Detokenizer() = default;
  virtual std::string push(int64_t id) = 0;
  virtual std::string finish() { return {}; }
};
using DetokenizerFactory = std::function<std::unique_ptr<Detokenizer>()>;
// A model's tokenizer as a detokenizer (text::TextStream: decode(ids) as transformers gives it).
KILN_API DetokenizerFactory detokenizer(const text::Tokenizer& tokenizer, bool skip_special_tokens = false);

struct GenerateOptions {
  int64_t max_new_tokens = 20;
  double temperature = 0.0;                 // 0: greedy; > 0: sample
  int64_t top_k = 0;                        // 0: every token
  double top_p = 1.0;                       // 1: every token
  double repetition_penalty = 1.0;          // 1: none (transformers' RepetitionPenaltyLogitsProcessor)
  uint64_t seed = 0;                        // row i of `prompts` samples from a generator seeded with seed + i
  int64_t vocab_limit = 0;                  // > 0: only ids below it (a tokenizer smaller than the model's vocabulary)
  std::vector<int64_t> stop_ids{};          // end a sequence (the model's EOS ids, and any others)
  std::vector<std::string> stop_strings{};  // end a sequence when its text contains one (needs `detokenizer`)
  int64_t batch_size = 0;                   // prompts decoded together (0: all; 1: one after the other)
  DetokenizerFactory detokenizer{};         // one per sequence: Generation::text, stop strings, on_text
  // Streaming: called with (sequence index, id) as each token is chosen.
  std::function<void(size_t, int64_t)> on_token{};
  // Streaming text (with a detokenizer): (sequence index, text) as text becomes final; the pieces of a
  // sequence concatenate to its Generation::text.
  std::function<void(size_t, const std::string&)> on_text{};
};

struct GenerateStats {
  int64_t prefill_tokens = 0, decode_tokens = 0;  // prompt tokens read (no padding); tokens from decode passes
  int64_t prefill_passes = 0, decode_passes = 0;  // forward passes (a batch's rows share one)
  double prefill_seconds = 0, decode_seconds = 0;
  double prefill_tokens_per_second() const { return prefill_seconds > 0 ? static_cast<double>(prefill_tokens) / prefill_seconds : 0; }
  double decode_tokens_per_second() const { return decode_seconds > 0 ? static_cast<double>(decode_tokens) / decode_seconds : 0; }
};

enum class Finish { length, stop_id, stop_string };

struct Generation {
  std::vector<std::vector<int64_t>> ids;  // per prompt: the generated ids (not the prompt)
  std::vector<std::string> text;          // per prompt, with a detokenizer: the generated text (up to a stop string)
  std::vector<Finish> finish;             // per prompt: why it ended
  GenerateStats stats;
};

// Stop strings on a stream of text pieces: what may be given out now, and whether a stop string
// appeared. Text that could still begin a stop string is held back until it cannot.
class StopText {
 public:
  explicit StopText(const std::vector<std::string>& stops) : stops_(&stops) {}
  // Adds `piece`; returns the text now final. stopped() turns true when a stop string appears (the text
  // before it is returned, the rest dropped).
  std::string push(const std::string& piece);
  // The end of the sequence: the held-back text (nothing after a stop).
  std::string finish();
  bool stopped() const { return stopped_; }

 private:
  const std::vector<std::string>* stops_;
  std::string held_;
  bool stopped_ = false;
};

// The logits processors above, in place, on one row of logits; removed tokens become -inf.
// `context`: the ids so far (prompt and generated), for the repetition penalty.
void process_logits(std::vector<float>& logits, const std::vector<int64_t>& context, const GenerateOptions& o);

// The model reads the prompt and every new token but the last, so prompt + max_new_tokens - 1 positions
// must fit its learned positions (GPT-2's n_positions; as transformers' generate), or for kiln's GPT
// its max_seq_len (the KV caches' capacity).
template <Backend B>
KILN_API Generation generate(const hf::CausalLM<B>& model, const std::vector<std::vector<int64_t>>& prompts, const GenerateOptions& o);
template <Backend B>
KILN_API Generation generate(const GPT<B>& model, const std::vector<std::vector<int64_t>>& prompts, const GenerateOptions& o);

}  // namespace kiln::nn
#pragma GCC visibility pop
