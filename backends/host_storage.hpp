#pragma once
// Host memory shared by the Reference and Cpu backends: one 64-byte aligned block, freed with its
// last handle (large blocks go back to a cache for reuse: core/host_alloc.hpp). Both backends use
// this type, so moving a tensor between them is a memcpy.
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "kiln/core/error.hpp"
#include "kiln/core/host_alloc.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

class HostStorage {
 public:
  explicit HostStorage(size_t bytes) : bytes_(bytes) {
    data_ = host_alloc(bytes);
    if (bytes && !data_) fail("allocate: out of host memory allocating {} bytes", bytes);
  }
  ~HostStorage() { host_free(data_, bytes_); }
  HostStorage(const HostStorage&) = delete;
  HostStorage& operator=(const HostStorage&) = delete;

  size_t bytes() const { return bytes_; }
  void* data() { return data_; }
  const void* data() const { return data_; }
  template <class T> T* as() { return static_cast<T*>(data_); }
  template <class T> const T* as() const { return static_cast<const T*>(data_); }

  static std::shared_ptr<HostStorage> make(size_t bytes) { return std::make_shared<HostStorage>(bytes); }
  void write(size_t off, const void* src, size_t n) {
    KILN_CHECK(off + n <= bytes_, "write: {} bytes at offset {} overflow a storage of {} bytes", n, off, bytes_);
    if (n) std::memcpy(static_cast<char*>(data_) + off, src, n);
  }
  void read(size_t off, void* dst, size_t n) const {
    KILN_CHECK(off + n <= bytes_, "read: {} bytes at offset {} overflow a storage of {} bytes", n, off, bytes_);
    if (n) std::memcpy(dst, static_cast<const char*>(data_) + off, n);
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace kiln
#pragma GCC visibility pop
