#pragma once
// The Cuda backend for users: Tensor<Cuda>, and the device runtime's controls.
//
//   if (kiln::cuda::available()) { auto x = kiln::Tensor<kiln::Cuda>::randn({1024, 1024}, gen); ... }
//
// One stream per device; every op on a device is queued on it, so host code never waits except
// where it reads values back (item(), to_vector(), to<Cpu>(), printing) or calls synchronize().
#include <cstddef>
#include <string>

#include "kiln/backends/cuda/allocator.hpp"
#include "kiln/backends/cuda/cuda_backend.hpp"
#include "kiln/core/tensor.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

extern template class Tensor<Cuda>;

namespace cuda {

// True when a CUDA device can be used (a driver is loaded and at least one device is visible).
bool available();
// Devices visible (0 without a driver or a device).
int device_count();
// Why no device can be used ("" when one can): the CUDA error string of cudaGetDeviceCount.
std::string unavailable_reason();
// The device new tensors are allocated on and ops run on, for the calling thread (default 0).
void set_device(int device);
int current_device();
std::string device_name(int device = -1);
// Waits for everything queued on the current device's stream.
void synchronize();

// The current device's caching allocator (allocator.hpp).
MemoryStats memory_stats();
void reset_peak_memory_stats();
void empty_cache();

// f32 matmuls may use TF32 tensor cores (10-bit mantissa inputs, f32 accumulation). Off by default,
// so f32 results match the CPU to f32 roundoff; on for speed (PyTorch's allow_tf32).
void set_allow_tf32(bool allow);
bool allow_tf32();

// f32 flash attention on the tensor cores where the head dims allow it (d and dv multiples of 8, at
// most 128, and tiles within the device's shared memory per block): TF32 products in the 3xTF32 split,
// so f32 accuracy is kept, whatever allow_tf32 says. On by default; off, every f32 case runs the FMA
// kernels (for comparisons).
void set_attention_tensor_cores(bool on);
bool attention_tensor_cores();

// bf16/f16 flash attention on the tensor cores in its own precision, as FlashAttention-2 does: every
// product (Q·Kᵀ, P·V; backward also dO·Vᵀ, Pᵀ·dO, dS·K, dSᵀ·Q) of bf16/f16 operands with f32
// accumulation, P and dS rounded to the inputs' dtype for their products, the softmax in f32. Forward
// where d is a multiple of 16 and dv of 8, backward where both are multiples of 16, both at most 128.
// On by default (with attention_tensor_cores); off, half inputs run the f32 kernels on their widened
// values, which gives the f32 path's results rounded once (core/fused.hpp's exact contract).
void set_attention_half_products(bool on);
bool attention_half_products();

// Query rows per thread block of the bf16/f16 attention forward's and dQ pass's own kernels (the half
// products above): 64 (four warps of 16 rows; the default) or 128 (four warps of 32 rows, so each
// fragment of K and V read from shared memory serves two row blocks, as FlashAttention-2's forward
// does), taken where d and dv are at most 64 (wider heads keep 64); 0 restores the default, any other
// value is a kiln::Error. KILN_CUDA_ATTENTION_ROWS=64|128 sets it for a process.
// The same results either way (every row's arithmetic is the same); for comparisons: on an H100, 128
// rows were slower at GPT-2-small's shape (bench/RESULTS.md, seventh lease).
void set_attention_query_rows(int rows);
int attention_query_rows();  // the setting: 64, 128, or 0 (the default)

}  // namespace cuda
}  // namespace kiln
#pragma GCC visibility pop
