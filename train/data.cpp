#include "kiln/train/data.hpp"

#include <algorithm>
#include <cstring>

#include "kiln/formats/printable.hpp"
#include "kiln/formats/safetensors.hpp"

namespace kiln {

namespace {

// n little-endian integers of type T from the file's bytes (x86-64 is little-endian).
template <class T> void widen(const unsigned char* p, size_t n, std::vector<int64_t>& out) {
  out.resize(n);
  for (size_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));
    out[i] = static_cast<int64_t>(v);
  }
}

}  // namespace

TokenData TokenData::load(const std::string& path, const std::string& name) {
  const auto f = safetensors::File::open(path);
  KILN_CHECK(f.contains(name), "token data: '{}' has no tensor '{}' (it has: {})", path, name,
             printable(fmt::format("{}", fmt::join(f.names(), ", ")), 400));
  const auto& info = f.info(name);
  KILN_CHECK(info.shape.size() == 1, "token data: '{}': '{}' must be 1-D, got shape {}", path, name, shape_str(info.shape));
  // Straight from the mapped bytes: no backend, no copy through a tensor.
  const size_t n = static_cast<size_t>(numel(info.shape));
  const unsigned char* p = f.data(name);
  const std::string& t = info.st_dtype;
  std::vector<int64_t> v;
  if (t == "I64") widen<int64_t>(p, n, v);
  else if (t == "I32") widen<int32_t>(p, n, v);
  else if (t == "U32") widen<uint32_t>(p, n, v);
  else if (t == "I16") widen<int16_t>(p, n, v);
  else if (t == "U16") widen<uint16_t>(p, n, v);
  else if (t == "I8") widen<int8_t>(p, n, v);
  else if (t == "U8") widen<uint8_t>(p, n, v);
  else fail("token data: '{}': '{}' must hold integers, got {}", path, name, t);
  TokenData d(std::move(v), path);
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
