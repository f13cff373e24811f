#pragma once
// kiln::text internals (not installed): the interface both tokenizer kinds implement, and the helpers
// they share. Users see text/tokenizer.hpp only.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/text/tokenizer.hpp"

namespace kiln::text {

class Tokenizer::Impl {
 public:
  virtual ~Impl() = default;
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const = 0;
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const = 0;
  virtual std::string token(int32_t id) const = 0;
  virtual std::optional<int32_t> id(std::string_view piece) const = 0;
  virtual bool is_special(int32_t id) const = 0;

  std::string path, description;
  int32_t vocab_size = 0;
  std::optional<int32_t> bos, eos, unk;
};

namespace detail {

// tokenizer.json (+ tokenizer_config.json when `config_path` is not empty).
std::shared_ptr<const Tokenizer::Impl> load_hf_json(const std::string& json_path, const std::string& config_path);
// tokenizer.model (+ tokenizer_config.json when `config_path` is not empty).
std::shared_ptr<const Tokenizer::Impl> load_sentencepiece(const std::string& model_path, const std::string& config_path);

// The byte offset of the first byte that does not belong to valid UTF-8 (overlongs, surrogates and code
// points past U+10FFFF are invalid, as in Rust and Python), or text.size() when all of it is valid.
size_t utf8_valid_prefix(std::string_view text);
// Rust's String::from_utf8_lossy: each maximal invalid subsequence becomes U+FFFD.
std::string utf8_lossy(std::string_view bytes);
// Appends the UTF-8 encoding of code point `cp`.
void append_utf8(std::string& out, uint32_t cp);
// Decodes the code point at s[i] (valid UTF-8) and advances i.
uint32_t next_code_point(std::string_view s, size_t& i);

// The file's bytes; a kiln::Error naming it when it cannot be read.
std::string read_file(const std::string& path);

// GPT-2's byte-level pre-tokenization (tokenizers' ByteLevel with use_regex and no prefix space), for
// the BPE trainer: the pieces of valid UTF-8 `text` as the GPT-2 regex splits it, in order.
void byte_level_pieces(std::string_view text, const std::function<void(std::string_view)>& piece);
// GPT-2's stand-in code point for byte b (the alphabet of byte-level vocabularies: "Ġ" for ' ').
uint32_t byte_level_char(uint8_t b);

}  // namespace detail
}  // namespace kiln::text
