#include "kiln/train/data.hpp"

#include <algorithm>

#include "kiln/backends/cpu/cpu.hpp"
#include "kiln/formats/safetensors.hpp"

namespace kiln {

TokenData TokenData::load(const std::string& path, const std::string& name) {
  const auto f = safetensors::File::open(path);
  KILN_CHECK(f.contains(name), "token data: '{}' has no tensor '{}' (it has: {})", path, name, fmt::join(f.names(), ", "));
  const auto& info = f.info(name);
  KILN_CHECK(info.shape.size() == 1, "token data: '{}': '{}' must be 1-D, got shape {}", path, name, shape_str(info.shape));
  KILN_CHECK(is_integral(info.dtype), "token data: '{}': '{}' must hold integers, got {}", path, name, info.st_dtype);
  TokenData d(to_vector<int64_t>(f.load<Cpu>(name)), path);
  for (size_t i = 0; i < d.tokens_.size(); ++i)
    KILN_CHECK(d.tokens_[i] >= 0, "token data: '{}': negative token {} at position {}", path, d.tokens_[i], i);
  return d;
}

int64_t TokenData::max_token() const { return tokens_.empty() ? -1 : *std::max_element(tokens_.begin(), tokens_.end()); }

void TokenData::check_vocab(int64_t vocab) const {
  for (size_t i = 0; i < tokens_.size(); ++i)
    KILN_CHECK(tokens_[i] >= 0 && tokens_[i] < vocab, "token data: '{}': token {} at position {} is outside the vocabulary [0, {})",
               source_, tokens_[i], i, vocab);
}

}  // namespace kiln
