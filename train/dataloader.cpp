#include "kiln/train/dataloader.hpp"

#include <charconv>

#include "kiln/core/rng.hpp"
#include "kiln/formats/printable.hpp"

namespace kiln {

namespace {
// SplitMix64: turns (seed, epoch) into a well-mixed Philox key.
uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::string need(const std::map<std::string, std::string>& m, const std::string& key) {
  auto it = m.find(key);
  KILN_CHECK(it != m.end(), "DataLoaderState::from_map: missing key '{}'", key);
  return it->second;
}

template <class T> T parse_int(const std::map<std::string, std::string>& m, const std::string& key) {
  const std::string s = need(m, key);
  T v{};
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  KILN_CHECK(ec == std::errc() && p == s.data() + s.size(), "DataLoaderState::from_map: '{}' = '{}' is not an integer", key,
             printable(s, 40));
  return v;
}

bool parse_bool(const std::map<std::string, std::string>& m, const std::string& key) {
  const std::string s = need(m, key);
  KILN_CHECK(s == "true" || s == "false", "DataLoaderState::from_map: '{}' = '{}' is not true/false", key, printable(s, 40));
  return s == "true";
}
}  // namespace

std::vector<int64_t> shuffled_indices(int64_t n, uint64_t seed, int64_t epoch) {
  KILN_CHECK(n >= 0, "shuffled_indices: negative size {}", n);
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = i;
  const uint64_t key = mix64(seed ^ mix64(static_cast<uint64_t>(epoch)));
  // Fisher–Yates from the back: step i swaps p[i] with p[j], j uniform in [0, i] from one 64-bit Philox
  // draw (counter i). The modulo bias is below 2^-32 for any realistic dataset size.
  for (int64_t i = n - 1; i > 0; --i) {
    const Philox4x32 r = philox4x32_10(static_cast<uint64_t>(i), key);
    const uint64_t u = (static_cast<uint64_t>(r.v[0]) << 32) | r.v[1];
    const int64_t j = static_cast<int64_t>(u % static_cast<uint64_t>(i + 1));
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(j)]);
  }
  return p;
}

std::map<std::string, std::string> DataLoaderState::to_map(const std::string& prefix) const {
  return {{prefix + "epoch", std::to_string(epoch)},
          {prefix + "position", std::to_string(position)},
          {prefix + "seed", std::to_string(seed)},
          {prefix + "dataset_size", std::to_string(dataset_size)},
          {prefix + "batch_size", std::to_string(batch_size)},
          {prefix + "shuffle", shuffle ? "true" : "false"},
          {prefix + "drop_last", drop_last ? "true" : "false"}};
}

DataLoaderState DataLoaderState::from_map(const std::map<std::string, std::string>& m, const std::string& prefix) {
  DataLoaderState s;
  s.epoch = parse_int<int64_t>(m, prefix + "epoch");
  s.position = parse_int<int64_t>(m, prefix + "position");
  s.seed = parse_int<uint64_t>(m, prefix + "seed");
  s.dataset_size = parse_int<int64_t>(m, prefix + "dataset_size");
  s.batch_size = parse_int<int64_t>(m, prefix + "batch_size");
  s.shuffle = parse_bool(m, prefix + "shuffle");
  s.drop_last = parse_bool(m, prefix + "drop_last");
  return s;
}

BatchSampler::BatchSampler(int64_t dataset_size, DataLoaderOptions o) : n_(dataset_size), o_(o) {
  KILN_CHECK(o_.batch_size > 0, "DataLoader: batch_size must be positive, got {}", o_.batch_size);
  KILN_CHECK(n_ >= 0, "DataLoader: dataset size {} is negative", n_);
  const int N = o_.world_size;
  KILN_CHECK(N >= 1 && o_.rank >= 0 && o_.rank < N, "DataLoader: rank {} is not in [0, world_size = {})", o_.rank, N);
  KILN_CHECK(o_.batch_size % N == 0, "DataLoader: batch_size {} does not divide among {} ranks (world_size): choose a multiple of {}",
             o_.batch_size, N, N);
  const int64_t tail = n_ % o_.batch_size;
  KILN_CHECK(o_.drop_last || tail % N == 0,
             "DataLoader: the last batch of an epoch ({} of {} samples, batch_size {}) does not divide among {} ranks: set drop_last, "
             "or choose a dataset size or batch size so that it does",
             tail, n_, o_.batch_size, N);
}

int64_t BatchSampler::batches_per_epoch() const { return o_.drop_last ? n_ / o_.batch_size : (n_ + o_.batch_size - 1) / o_.batch_size; }

std::vector<int64_t> BatchSampler::order(int64_t epoch) const {
  if (o_.shuffle) return shuffled_indices(n_, o_.seed, epoch);
  std::vector<int64_t> p(static_cast<size_t>(n_));
  for (int64_t i = 0; i < n_; ++i) p[static_cast<size_t>(i)] = i;
  return p;
}

std::optional<std::vector<int64_t>> BatchSampler::next() {
  if (position_ >= batches_per_epoch()) {
    ++epoch_;
    position_ = 0;
    return std::nullopt;
  }
  if (cached_epoch_ != epoch_) {
    order_ = order(epoch_);
    cached_epoch_ = epoch_;
  }
  int64_t start = position_ * o_.batch_size, end = std::min(n_, start + o_.batch_size);
  ++position_;
  if (o_.world_size > 1) {  // this rank's contiguous share (the constructor checked that it divides)
    const int64_t share = (end - start) / o_.world_size;
    start += o_.rank * share;
    end = start + share;
  }
  return std::vector<int64_t>(order_.begin() + start, order_.begin() + end);
}

void BatchSampler::set_epoch(int64_t e) {
  KILN_CHECK(e >= 0, "DataLoader::set_epoch: negative epoch {}", e);
  epoch_ = e;
  position_ = 0;
}

DataLoaderState BatchSampler::state() const { return {epoch_, position_, o_.seed, n_, o_.batch_size, o_.shuffle, o_.drop_last}; }

void BatchSampler::load_state(const DataLoaderState& s) {
  KILN_CHECK(s.dataset_size == n_, "DataLoader::load_state: the state is for a dataset of {} samples, this one has {}", s.dataset_size, n_);
  KILN_CHECK(s.batch_size == o_.batch_size, "DataLoader::load_state: the state has batch_size {}, this loader {}", s.batch_size,
             o_.batch_size);
  KILN_CHECK(s.shuffle == o_.shuffle && s.drop_last == o_.drop_last,
             "DataLoader::load_state: the state has shuffle={} drop_last={}, this loader shuffle={} drop_last={}", s.shuffle, s.drop_last,
             o_.shuffle, o_.drop_last);
  KILN_CHECK(s.seed == o_.seed, "DataLoader::load_state: the state has seed {}, this loader seed {}", s.seed, o_.seed);
  KILN_CHECK(s.epoch >= 0 && s.position >= 0 && s.position <= batches_per_epoch(),
             "DataLoader::load_state: epoch {} position {} out of range ({} batches per epoch)", s.epoch, s.position, batches_per_epoch());
  epoch_ = s.epoch;
  position_ = s.position;
}

}  // namespace kiln
