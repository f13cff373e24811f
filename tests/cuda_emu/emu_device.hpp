#pragma once
// The emulated device: its properties (emu.cpp) and its memory (emu_cudart.cpp: every cudaMalloc'd
// buffer is host memory, recorded here so that runtime calls and cuBLAS can check that what they touch
// lies inside one live allocation, a host-side stand-in for compute-sanitizer's memcheck of API calls).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

namespace emu {

// Both the kernel-level runtime (emu_runtime.cpp) and emu_cudart.cpp report this device: an H100's
// limits (48 KiB of shared memory per block by default, 227 KiB with the opt-in), but 4 SMs, so that
// reductions that split rows across SMs do so on small inputs, and kTotalMemory bytes.
const cudaDeviceProp& device_properties();
constexpr size_t kTotalMemory = size_t{4} << 30;

}  // namespace emu

namespace emu::device {

// True when [p, p + bytes) lies inside one live device allocation (bytes == 0: p inside or at its end).
bool contains(const void* p, size_t bytes);
// A description of p for error messages: "device buffer 0x.. (+off of N bytes)" or "not device memory".
std::string describe(const void* p);
// Live device allocations and their total size.
size_t live_allocations();
size_t live_bytes();
// Host waits so far: calls that block the host until the GPU has caught up (cudaStreamSynchronize,
// cudaDeviceSynchronize, cudaEventSynchronize). Each one drains the GPU's queue of work, so a step
// that waits often leaves the GPU idle while the host launches the next kernels.
uint64_t host_waits();

}  // namespace emu::device
