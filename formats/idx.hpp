#pragma once
// IDX files (the format of MNIST and Fashion-MNIST), raw or gzip-compressed, and an image
// classification dataset built from a pair of them.
//
// An IDX file is: two zero bytes, a type byte (0x08 ubyte, 0x09 i8, 0x0B i16, 0x0C i32, 0x0D f32,
// 0x0E f64), a byte with the number of dimensions d, d big-endian u32 sizes, then the values
// (big-endian, row-major). read_idx checks all of it — magic, type, rank, sizes, that the file holds
// exactly the values the header announces (no fewer, no more) and that a .gz stream is intact — and
// throws a kiln::Error naming the file and the problem. Compression is detected from the content
// (gzip's 1f 8b), not the name.
//
//   auto train = IdxDataset::load_split("/usr/share/datasets/fashion-mnist", "train");
//   auto [x, y] = train.tensors<Cpu>();   // inputs f32 [N, 784] in [0, 1], targets i64 [N]
//   TensorDataset<Cpu> data(x, y);        // train/dataloader.hpp
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/core/tensor.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

// A whole IDX dataset as tensors along their first axis, plain members: `auto [x, y] = d.tensors<B>()`
// gives two Tensor<B>, which template code deduces from as it does from any tensor (a TensorDataset
// (train/dataloader.hpp) is built from them: TensorDataset<B>(x, y)).
template <Backend B> struct IdxTensors {
  Tensor<B> inputs;   // f32 [N, sample_numel] or [N, d1, ..., dk]
  Tensor<B> targets;  // i64 [N]
};

enum class IdxType : uint8_t { u8 = 0x08, i8 = 0x09, i16 = 0x0B, i32 = 0x0C, f32 = 0x0D, f64 = 0x0E };

// One IDX array: its element type, its sizes and its values in host byte order.
struct IdxArray {
  IdxType type = IdxType::u8;
  std::vector<int64_t> dims;
  std::vector<uint8_t> bytes;  // numel() · element size, host byte order

  int64_t numel() const;
  // The values converted to T (any arithmetic type).
  template <class T> std::vector<T> values() const;
};

// Reads an IDX file (raw or .gz). Limits: rank 1..8, at most 2^31 − 1 per dimension and 2^34 bytes of data.
IdxArray read_idx(const std::string& path);

// Writes an IDX file (gzip-compressed when gzip is true); used by tests and tools.
void write_idx(const std::string& path, const IdxArray& a, bool gzip = false);

struct IdxImageOptions {
  // Pixels become (v / 255 − mean) / std.
  double mean = 0.0;
  double std = 1.0;
};

// Images (IDX ubyte [N, d1, ..., dk]) and their labels (IDX ubyte or i32 [N]), held on the host.
class IdxDataset {
 public:
  // Loads and cross-checks a pair of files: same N, labels in [0, 256).
  static IdxDataset load(const std::string& images_path, const std::string& labels_path, IdxImageOptions o = {});
  // The MNIST file layout: <dir>/<split>-images-idx3-ubyte[.gz] and <dir>/<split>-labels-idx1-ubyte[.gz],
  // split "train" or "t10k". A missing file throws naming the paths tried.
  static IdxDataset load_split(const std::string& dir, const std::string& split, IdxImageOptions o = {});

  int64_t size() const { return static_cast<int64_t>(labels_.size()); }
  // The shape of one image ([rows, cols] for MNIST).
  const Shape& sample_shape() const { return sample_shape_; }
  int64_t sample_numel() const { return numel(sample_shape_); }
  int64_t num_classes() const { return num_classes_; }          // largest label + 1
  const std::vector<float>& images() const { return images_; }  // [N · sample_numel], normalised
  const std::vector<int64_t>& labels() const { return labels_; }

  // The whole set as tensors: inputs f32 [N, sample_numel] (flatten) or [N, d1, ..., dk], targets i64 [N].
  template <Backend B> IdxTensors<B> tensors(bool flatten = true) const {
    Shape shape{size()};
    if (flatten)
      shape.push_back(sample_numel());
    else
      shape.insert(shape.end(), sample_shape_.begin(), sample_shape_.end());
    return {Tensor<B>::from_vector(images_, shape), Tensor<B>::from_vector(labels_, {size()})};
  }

 private:
  Shape sample_shape_;
  int64_t num_classes_ = 0;
  std::vector<float> images_;
  std::vector<int64_t> labels_;
};

}  // namespace kiln
#pragma GCC visibility pop
