#include "kiln/train/data.hpp"

#include <algorithm>
#include <cstring>

#include "kiln/core/rng.hpp"
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
  if (t == "I64")
    widen<int64_t>(p, n, v);
  else if (t == "I32")
    widen<int32_t>(p, n, v);
  else if (t == "U32")
    widen<uint32_t>(p, n, v);
  else if (t == "I16")
    widen<int16_t>(p, n, v);
  else if (t == "U16")
    widen<uint16_t>(p, n, v);
  else if (t == "I8")
    widen<int8_t>(p, n, v);
  else if (t == "U8")
    widen<uint8_t>(p, n, v);
  else
    fail("token data: '{}': '{}' must hold integers, got {}", path, name, t);
  TokenData d(std::move(v), path);
  for (size_t i = 0; i < d.tokens_.size(); ++i)
    KILN_CHECK(d.tokens_[i] >= 0, "token data: '{}': negative token {} at position {}", path, d.tokens_[i], i);
  return d;
}

namespace {
// A seeded bijection of [0, n) for each epoch: a 4-round Feistel network on the smallest even number of
// bits covering n, Philox as its round function, walked until it lands inside [0, n) (cycle walking keeps
// it a bijection of [0, n); each walk step is a bijection of the power of two).
uint64_t permute(uint64_t x, uint64_t n, uint64_t key, uint64_t epoch) {
  int bits = 2;
  while ((uint64_t{1} << bits) < n) bits += 2;
  const int h = bits / 2;
  const uint64_t mask = (uint64_t{1} << h) - 1;
  do {
    uint64_t l = x >> h, r = x & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t f = philox4x32_10(((epoch << 2 | round) << 32) | r, key).v[0] & mask;
      const uint64_t next = l ^ f;
      l = r;
      r = next;
    }
    x = (l << h) | r;
  } while (x >= n);
  return x;
}
}  // namespace

int64_t TokenData::row_start(int64_t j, int64_t T) const {
  const int64_t N = size();
  const int64_t W = (N - T) / T;  // windows per epoch: o_e + (W − 1)·T + T < N for any o_e < T
  if (!shuffled_ || W < 1) return (j * T) % (N - T);
  const auto epoch = static_cast<uint64_t>(j / W), k = static_cast<uint64_t>(j % W);
  const auto offset = static_cast<int64_t>(philox4x32_10(epoch, seed_ ^ 0x9E3779B97F4A7C15ull).v[1] % static_cast<uint64_t>(T));
  return offset + static_cast<int64_t>(permute(k, static_cast<uint64_t>(W), seed_, epoch)) * T;
}

int64_t TokenData::max_token() const { return tokens_.empty() ? -1 : *std::max_element(tokens_.begin(), tokens_.end()); }

void TokenData::check_vocab(int64_t vocab) const {
  for (size_t i = 0; i < tokens_.size(); ++i)
    KILN_CHECK(tokens_[i] >= 0 && tokens_[i] < vocab, "token data: '{}': token {} at position {} is outside the vocabulary [0, {})",
               source_, tokens_[i], i, vocab);
}

}  // namespace kiln
