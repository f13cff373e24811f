#pragma once
// The CUDA runtime glue shared by the Cuda backend's sources (not a user header; users include
// backends/cuda/cuda.hpp): error checks, the per-device stream and library handles.
//
// Every CUDA and cuBLAS call and every kernel launch is checked; a failure becomes a
// kiln::Error naming the op, the call and CUDA's error string. Kernels run asynchronously, so an error
// inside a kernel (an illegal address) surfaces at the next synchronising call (read(), synchronize()).
// KILN_CUDA_SYNC=1 in the environment synchronises after every launch so the error names the kernel
// that caused it (like CUDA_LAUNCH_BLOCKING=1). KILN_CUDA_NO_CACHE=1 turns the caching allocator off
// (every tensor its own exact-size cudaMalloc, freed at once: for compute-sanitizer's memcheck).
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string_view>

#include "kiln/backends/cuda/cuda_backend.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::cuda {

[[noreturn]] void raise_cuda(cudaError_t e, std::string_view op, const char* call, const char* file, int line);
[[noreturn]] void raise_cublas(cublasStatus_t s, std::string_view op, const char* call, const char* file, int line);

#define KILN_CUDA_CHECK_OP(op, expr)                                                              \
  do {                                                                                            \
    const cudaError_t kiln_e_ = (expr);                                                           \
    if (kiln_e_ != cudaSuccess) ::kiln::cuda::raise_cuda(kiln_e_, op, #expr, __FILE__, __LINE__); \
  } while (0)
#define KILN_CUDA_CHECK(expr) KILN_CUDA_CHECK_OP("cuda", expr)
#define KILN_CUBLAS_CHECK_OP(op, expr)                                                                        \
  do {                                                                                                        \
    const cublasStatus_t kiln_s_ = (expr);                                                                    \
    if (kiln_s_ != CUBLAS_STATUS_SUCCESS) ::kiln::cuda::raise_cublas(kiln_s_, op, #expr, __FILE__, __LINE__); \
  } while (0)
// After every kernel launch: the launch's own error (bad configuration, no kernel image for this
// device), and with KILN_CUDA_SYNC=1 the kernel's execution error.
#define KILN_CUDA_LAUNCHED(op) ::kiln::cuda::after_launch(op, __FILE__, __LINE__)
void after_launch(std::string_view op, const char* file, int line);

// The current device, checked usable: throws "<op>: no CUDA device (<reason>)" otherwise.
int require_device(std::string_view op);
// Throws unless the storage lives on the current device.
void check_device(const CudaStorage& s, std::string_view op);
// The current device's stream and cuBLAS handle (bound to that stream, with a 32 MiB workspace).
cudaStream_t stream();
cublasHandle_t cublas();
// Properties of the current device.
const cudaDeviceProp& device_properties();

}  // namespace kiln::cuda
#pragma GCC visibility pop
