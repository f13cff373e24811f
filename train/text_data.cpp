// TokenData from text: `kiln train --tokenizer` (train/data.hpp). Apart from data.cpp, which the
// fuzzers' reader library compiles without the tokenizers (fuzz/CMakeLists.txt).
#include "kiln/text/tokenizer.hpp"
#include "kiln/train/data.hpp"
#include "kiln/train/text.hpp"

namespace kiln {

std::optional<text::Tokenizer> training_tokenizer(const std::string& path, int64_t model_vocab) {
  if (path.empty()) return std::nullopt;
  text::Tokenizer tok = text::Tokenizer::load(path);
  KILN_CHECK(
      tok.vocab_size() <= model_vocab,
      "train: the tokenizer '{}' ({}) has ids up to {}, but the model's vocabulary has {} entries: give a model with vocab_size >= {}",
      tok.path(), tok.description(), tok.vocab_size() - 1, model_vocab, tok.vocab_size());
  return tok;
}

TokenData TokenData::load_or_tokenize(const std::string& path, const text::Tokenizer* tokenizer) {
  if (path.ends_with(".safetensors")) return load(path);
  KILN_CHECK(tokenizer,
             "token data: '{}' is not a token file (*.safetensors); to train on text, give the tokenizer (--tokenizer MODEL_DIR)", path);
  const auto ids = tokenizer->encode(read_text_file(path));
  return TokenData(std::vector<int64_t>(ids.begin(), ids.end()), path);
}

}  // namespace kiln
