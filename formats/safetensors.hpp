#pragma once
// safetensors read and write (https://huggingface.co/docs/safetensors: 8-byte little-endian header
// length N, N bytes of JSON, then the data; offsets relative to the data).
//
// Reading memory-maps the file and validates everything before a byte of tensor data is touched:
// header size (at most 100 MiB and inside the file), JSON syntax, known dtypes, non-negative shapes,
// offsets inside the data, sizes equal to numel * dtype size, no overlaps and no holes. Anything
// wrong is a kiln::Error naming the file, the tensor and the problem; nothing crashes.
// Writing goes to "<path>.tmp-<pid>", is flushed and fsync'ed, then renamed over <path>: a reader never
// sees a half-written file, whatever happens to the writer.
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/core/atomic_file.hpp"
#include "kiln/core/tensor.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::safetensors {

struct TensorInfo {
  DType dtype;           // kiln's dtype after loading
  std::string st_dtype;  // the file's dtype name ("F32", "U8", ...)
  Shape shape;
  size_t begin = 0, end = 0;  // byte offsets into the data section
};

// A memory-mapped, validated safetensors file. Movable, not copyable; unmaps on destruction.
class File {
 public:
  static File open(const std::string& path);
  File(File&&) noexcept;
  File& operator=(File&&) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return infos_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Raw little-endian bytes of a tensor in the file's dtype.
  const unsigned char* data(const std::string& name) const;

  // Drops the mapped pages that lie wholly inside a tensor's bytes from this process (madvise
  // MADV_DONTNEED; the file is read-only, so a later read maps them again). Loaders call it once a
  // tensor is copied, so that reading a checkpoint does not keep both the file and the weights resident.
  void release(const std::string& name) const;

  // The tensor, converted to kiln's dtype (integer types narrower than 32 bits widen to i32, U32 to i64).
  template <Backend B> Tensor<B> load(const std::string& name) const;

 private:
  File() = default;
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  size_t data_start_ = 0;
  std::map<std::string, TensorInfo> infos_;
  std::map<std::string, std::string> metadata_;
};

using Named = std::vector<std::pair<std::string, std::string>>;

// Writes tensors (any backend, any layout) atomically; names must be unique and non-empty.
template <Backend B> KILN_API void save(const std::string& path, const std::vector<std::pair<std::string, Tensor<B>>>& tensors,
                                        const std::map<std::string, std::string>& metadata = {});

// Loads every tensor of a file.
template <Backend B> KILN_API std::map<std::string, Tensor<B>> load(const std::string& path);

// Writes bytes to path atomically (temp file, fsync, rename): kiln::write_atomically (core/atomic_file.hpp).
using kiln::write_atomically;

}  // namespace kiln::safetensors
#pragma GCC visibility pop
