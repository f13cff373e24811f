#pragma once
// Mini-batches over an indexed dataset, with seeded per-epoch shuffling and a position that can be
// saved and restored.
//
//   TensorDataset<Cpu> data(x, y);                        // x [N, ...], y [N, ...]
//   DataLoader loader(data, {.batch_size = 128, .shuffle = true, .seed = 42});
//   for (int epoch = 0; epoch < 5; ++epoch)
//     for (auto [xb, yb] : loader) { ... }                // one epoch; the loader then moves to the next
//
// A dataset is anything with `int64_t size() const` and `get(const std::vector<int64_t>& indices) const`
// returning the batch of those samples (any type); TensorDataset is the common case.
//
// Order: epoch e visits the samples in a permutation that is a pure function of (seed, e) —
// Fisher–Yates driven by Philox-4x32-10, so the same on every platform, compiler and run — or in
// index order when shuffle is off. Batch b of epoch e holds positions [b·batch_size, (b+1)·batch_size)
// of that order; the last, short batch is dropped when drop_last is set.
//
// Data parallelism (world_size > 1, the distributed sampler): every rank walks the same order and
// takes its contiguous share of each global batch: rank r of N gets rows [r·b/N, (r+1)·b/N) of a batch
// of b rows. So N ranks with batch_size B, their gradients averaged (dist::DistributedDataParallel),
// take the steps of one process with batch_size B. Every batch must divide: B % N == 0, and the last,
// short batch of an epoch (when kept) too; otherwise the constructor raises a kiln::Error naming the
// sizes and N. Pass the group's place: {.batch_size = 64, .world_size = dist::world_size(),
// .rank = dist::rank()}. The state is the global one (the same on every rank), so a checkpoint
// resumes on any number of ranks.
//
// State: (epoch, position = batches already taken from the epoch) plus what they mean (seed, dataset
// size, batch size, shuffle, drop_last). A loader restored from a state continues with exactly the
// batches the saved one would have produced; a state from a differently configured loader is
// rejected, naming the mismatch.
#include <concepts>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/profile.hpp"
#include "kiln/core/tensor.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

struct DataLoaderOptions {
  int64_t batch_size = 32;  // the global batch: over all ranks when world_size > 1
  bool shuffle = true;
  bool drop_last = false;
  uint64_t seed = 0;
  int world_size = 1;  // ranks sharing each batch (data parallelism); 1 = the whole batch here
  int rank = 0;        // which share this loader yields, in [0, world_size)
};

struct DataLoaderState {
  int64_t epoch = 0;
  int64_t position = 0;  // batches already produced in this epoch
  uint64_t seed = 0;
  int64_t dataset_size = 0;
  int64_t batch_size = 0;
  bool shuffle = true;
  bool drop_last = false;

  // As string key/values (e.g. for safetensors metadata, with a prefix such as "data."), and back.
  std::map<std::string, std::string> to_map(const std::string& prefix = "") const;
  static DataLoaderState from_map(const std::map<std::string, std::string>& m, const std::string& prefix = "");
  bool operator==(const DataLoaderState&) const = default;
};

// The seeded permutation of [0, n) for one epoch (Fisher–Yates over Philox draws).
std::vector<int64_t> shuffled_indices(int64_t n, uint64_t seed, int64_t epoch);

// The index side of a DataLoader: which samples each batch holds, and the (epoch, position) state.
class BatchSampler {
 public:
  BatchSampler(int64_t dataset_size, DataLoaderOptions o);

  int64_t dataset_size() const { return n_; }
  const DataLoaderOptions& options() const { return o_; }
  int64_t batches_per_epoch() const;
  // The visiting order of epoch e (a permutation of [0, N), or the identity without shuffle).
  std::vector<int64_t> order(int64_t epoch) const;

  // The next batch's indices (this rank's share of it), or nullopt when the current epoch is
  // exhausted — which also moves the sampler to position 0 of the next epoch.
  std::optional<std::vector<int64_t>> next();
  int64_t epoch() const { return epoch_; }
  int64_t position() const { return position_; }
  // Jumps to the start of epoch e.
  void set_epoch(int64_t e);

  DataLoaderState state() const;
  void load_state(const DataLoaderState& s);

 private:
  int64_t n_;
  DataLoaderOptions o_;
  int64_t epoch_ = 0, position_ = 0;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> order_;
};

// Inputs and targets sharing their first axis (the sample axis).
template <Backend B> class TensorDataset {
 public:
  TensorDataset() = default;
  TensorDataset(Tensor<B> inputs, Tensor<B> targets) : x_(std::move(inputs)), y_(std::move(targets)) {
    KILN_CHECK(x_.dim() >= 1 && y_.dim() >= 1, "TensorDataset: inputs {} and targets {} need a sample axis", shape_str(x_.shape()),
               shape_str(y_.shape()));
    KILN_CHECK(x_.size(0) == y_.size(0), "TensorDataset: inputs {} and targets {} differ in their number of samples", shape_str(x_.shape()),
               shape_str(y_.shape()));
  }
  int64_t size() const { return x_.defined() ? x_.size(0) : 0; }
  const Tensor<B>& inputs() const { return x_; }
  const Tensor<B>& targets() const { return y_; }
  // The samples at these indices, in this order: (inputs [k, ...], targets [k, ...]).
  std::pair<Tensor<B>, Tensor<B>> get(const std::vector<int64_t>& indices) const {
    const Tensor<B> idx = Tensor<B>::from_vector(indices, {static_cast<int64_t>(indices.size())});
    return {x_.index_select(0, idx), y_.index_select(0, idx)};
  }

 private:
  Tensor<B> x_, y_;
};

template <class D>
concept IndexedDataset = requires(const D& d, const std::vector<int64_t>& idx) {
  { d.size() } -> std::convertible_to<int64_t>;
  d.get(idx);
};

// Batches of a dataset (held by value: TensorDataset shares its tensors, so copies are cheap).
template <IndexedDataset D> class DataLoader {
 public:
  using Batch = decltype(std::declval<const D&>().get(std::declval<const std::vector<int64_t>&>()));

  DataLoader(D dataset, DataLoaderOptions o) : data_(std::move(dataset)), sampler_(data_.size(), o) {}

  const D& dataset() const { return data_; }
  BatchSampler& sampler() { return sampler_; }
  int64_t batches_per_epoch() const { return sampler_.batches_per_epoch(); }
  int64_t epoch() const { return sampler_.epoch(); }
  int64_t position() const { return sampler_.position(); }
  void set_epoch(int64_t e) { sampler_.set_epoch(e); }
  DataLoaderState state() const { return sampler_.state(); }
  void load_state(const DataLoaderState& s) { sampler_.load_state(s); }

  // The next batch of the current epoch, or nullopt at its end (the loader then moves to the next epoch).
  std::optional<Batch> next() {
    const profile::Scope prof("dataloader.next", "data");
    auto idx = sampler_.next();
    if (!idx) return std::nullopt;
    return data_.get(*idx);
  }

  // Range over the rest of the current epoch: `for (auto [x, y] : loader)`.
  struct Sentinel {};
  class Iterator {
   public:
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    Iterator() = default;
    explicit Iterator(DataLoader* dl) : dl_(dl), cur_(dl->next()) {}
    const Batch& operator*() const { return *cur_; }
    Iterator& operator++() {
      cur_ = dl_->next();
      return *this;
    }
    void operator++(int) { ++*this; }
    bool operator==(Sentinel) const { return !cur_.has_value(); }

   private:
    DataLoader* dl_ = nullptr;
    std::optional<Batch> cur_;
  };
  Iterator begin() { return Iterator(this); }
  Sentinel end() { return {}; }

 private:
  D data_;
  BatchSampler sampler_;
};

}  // namespace kiln
#pragma GCC visibility pop
