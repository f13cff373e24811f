#pragma once
// Device memory of the Cuda backend: one block from the device's caching allocator, given back to
// the cache when the last handle goes. Plain C++ (no CUDA headers).
#include <cstddef>

#include "kiln/backends/cuda/allocator.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

class CudaStorage {
 public:
  CudaStorage(cuda::CachingAllocator::Block block, size_t bytes, int device) : block_(block), bytes_(bytes), device_(device) {}
  ~CudaStorage();
  CudaStorage(const CudaStorage&) = delete;
  CudaStorage& operator=(const CudaStorage&) = delete;

  size_t bytes() const { return bytes_; }
  int device() const { return device_; }
  void* data() { return block_.ptr; }
  const void* data() const { return block_.ptr; }
  template <class T> T* as() { return static_cast<T*>(block_.ptr); }
  template <class T> const T* as() const { return static_cast<const T*>(block_.ptr); }

 private:
  cuda::CachingAllocator::Block block_;
  size_t bytes_;
  int device_;
};

}  // namespace kiln
#pragma GCC visibility pop
