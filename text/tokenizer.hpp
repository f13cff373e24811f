#pragma once
// kiln::text: the tokenizers pretrained models ship, id for id what Hugging Face's `tokenizers` /
// `transformers` and Google's `sentencepiece` compute (docs/formats.md, "Tokenizers").
//
//   auto tok = kiln::text::Tokenizer::load("path/to/model_dir");   // or a tokenizer.json / .model file
//   std::vector<int32_t> ids = tok.encode("Hello world");          // BOS/EOS as the model's config says
//   std::string text = tok.decode(ids, /*skip_special_tokens=*/true);
//
// Two kinds, one interface:
// - tokenizer.json (Hugging Face `tokenizers`): a BPE model (byte-level as GPT-2, Llama 3 and Qwen2 ship
//   it, or SentencePiece-style with byte fallback as Llama 2 / Mistral's converted files), a Unigram
//   model (T5 / ALBERT style, Viterbi over the piece scores) or a WordPiece model (BERT) with its
//   normalizer, pre-tokenizer (regexes through PCRE2), added and special tokens, post-processor and
//   decoder; tokenizer_config.json beside it gives the BOS/EOS rules (add_bos_token / add_eos_token of
//   the Llama tokenizers) and clean_up_tokenization_spaces.
// - tokenizer.model (SentencePiece, BPE or unigram) through libsentencepiece, with BOS added as
//   transformers' LlamaTokenizer does (tokenizer_config.json's add_bos_token, default true;
//   add_eos_token, default false).
// A directory with both is read as tokenizer.json, as transformers' AutoTokenizer (the fast tokenizer).
//
// Anything kiln does not implement and that would change the ids (an unknown model, normalizer,
// pre-tokenizer, decoder or post-processor type, BPE dropout, an inverted split) is a kiln::Error naming
// the file and the field; so are truncated or corrupt files and merges that name a missing token.
// The tokenizer holds no mutable state visible to callers; encode/decode may run from several threads.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::text {

class Tokenizer {
 public:
  // A model directory (tokenizer.json [+ tokenizer_config.json], or tokenizer.model
  // [+ tokenizer_config.json]) or one of those files.
  static Tokenizer load(const std::string& path);

  // The ids of `text` (UTF-8). add_special_tokens: the post-processor's BOS/EOS (as transformers'
  // tokenizer(text, add_special_tokens=...)); special tokens written in the text are matched either way.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  // The text of `ids` as transformers' tokenizer.decode(ids, skip_special_tokens=...) gives it. Ids
  // outside [0, vocab_size()) are an error; bytes that do not form UTF-8 become U+FFFD.
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = false) const;

  // One past the largest id (the model's vocabulary and the added tokens): the embedding rows needed.
  int32_t vocab_size() const;
  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  std::optional<int32_t> unk_id() const;
  // The vocabulary piece of an id ("Ġworld", "▁world", "<|endoftext|>"), as convert_ids_to_tokens;
  // an id outside the vocabulary is an error.
  std::string token(int32_t id) const;
  // The id of a vocabulary piece or added token, if it has one (convert_tokens_to_ids).
  std::optional<int32_t> id(std::string_view piece) const;
  bool is_special(int32_t id) const;
  // "tokenizer.json (BPE, byte-level)", "tokenizer.model (sentencepiece, unigram)", ...
  std::string description() const;
  // The file it was read from.
  const std::string& path() const;

  class Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

// Streaming decode for generation: push the ids as they come, get the text they complete. The pieces
// concatenate to decode(all ids) (decoders that strip or join across tokens included) and never end in
// the middle of a multi-byte UTF-8 character: bytes of an unfinished character wait for the next ids,
// and so does a run of byte-fallback pieces ("<0xA3>"), which decode turns into text only as a whole.
class TextStream {
 public:
  explicit TextStream(Tokenizer tokenizer, bool skip_special_tokens = false);
  // The new text that `id` (or `ids`) completes; empty while a character is unfinished.
  std::string push(int32_t id);
  std::string push(std::span<const int32_t> ids);
  // What is left at the end (an unfinished character as U+FFFD, as decode gives it).
  std::string finish();
  // Everything pushed so far.
  const std::vector<int32_t>& ids() const { return ids_; }

 private:
  Tokenizer tok_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  size_t prefix_ = 0, read_ = 0;  // ids_[prefix_, read_) decode to the text already given out, as context
};

}  // namespace kiln::text
#pragma GCC visibility pop
