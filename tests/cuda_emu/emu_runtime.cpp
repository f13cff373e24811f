// The emulator's replacement for backends/cuda/runtime.cpp, compiled with -Dkiln=kilnemu: storage
// is host memory (malloc), the stream is null, launches are checked by emu::run_grid itself, and the
// "device" has 4 SMs so that reductions split long rows into pieces.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include <kiln/backends/cuda/cuda.hpp>
#include <kiln/backends/cuda/runtime.hpp>
#include <kiln/core/error.hpp>

namespace kiln::cuda {

// Device index of storage allocated by Cuda::allocate (freed with the storage); the bridge wraps
// caller-owned host buffers with kBorrowed, which the destructor leaves alone.
constexpr int kOwned = 0;

void raise_cuda(cudaError_t e, std::string_view op, const char* call, const char* file, int line) {
  fail("{}: CUDA error {} [{} at {}:{}]", op, static_cast<int>(e), call, file, line);
}
void raise_cublas(cublasStatus_t s, std::string_view op, const char* call, const char* file, int line) {
  fail("{}: cuBLAS error {} [{} at {}:{}]", op, static_cast<int>(s), call, file, line);
}
void after_launch(std::string_view, const char*, int) {}
int require_device(std::string_view) { return 0; }
void check_device(const CudaStorage&, std::string_view) {}
cudaStream_t stream() { return nullptr; }
const cudaDeviceProp& device_properties() { return ::emu::device_properties(); }
namespace {
bool g_attention_tc = true;
bool g_attention_half = true;
int g_attention_rows = 0;
}  // namespace
void set_attention_tensor_cores(bool on) { g_attention_tc = on; }
bool attention_tensor_cores() { return g_attention_tc; }
void set_attention_half_products(bool on) { g_attention_half = on; }
bool attention_half_products() { return g_attention_half; }
void set_attention_query_rows(int rows) {
  KILN_CHECK(rows == 0 || rows == 64 || rows == 128, "cuda::set_attention_query_rows: rows must be 64, 128 or 0 (the default), got {}",
             rows);
  g_attention_rows = rows;
}
int attention_query_rows() { return g_attention_rows; }

}  // namespace kiln::cuda

namespace kiln {

CudaStorage::~CudaStorage() {
  if (device_ == cuda::kOwned) std::free(block_.ptr);
}

std::shared_ptr<CudaStorage> Cuda::allocate(size_t bytes) {
  void* p = std::malloc(bytes ? bytes : 1);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0xff, bytes);  // garbage (NaN / -1): kernels must not rely on zeroed memory
  return std::make_shared<CudaStorage>(cuda::CachingAllocator::Block{p, bytes}, bytes, cuda::kOwned);
}

void Cuda::write(Storage& s, size_t off, const void* src, size_t n) {
  KILN_CHECK(off + n <= s.bytes(), "write: {} bytes at offset {} overflow a storage of {} bytes", n, off, s.bytes());
  if (n) std::memcpy(static_cast<char*>(s.data()) + off, src, n);
}

void Cuda::read(const Storage& s, size_t off, void* dst, size_t n) {
  KILN_CHECK(off + n <= s.bytes(), "read: {} bytes at offset {} overflow a storage of {} bytes", n, off, s.bytes());
  if (n) std::memcpy(dst, static_cast<const char*>(s.data()) + off, n);
}

}  // namespace kiln
