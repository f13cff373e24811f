// Deliberately wrong kernels for test_emu_device: the emulator must refuse each, as a GPU would fail or
// misbehave on it. Transformed by transform.py and compiled with emu.hpp like the backend's kernels
// (never by nvcc).
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "emu_selftest.hpp"

namespace {

// Half the warp waits at a warp barrier, the other half at the block barrier: neither completes.
// (Threads that have exited count as arrived at __syncthreads, as on the hardware.)
__global__ void barrier_in_divergent_code(int* out) {
  if (threadIdx.x < 16)
    __syncwarp();
  else
    __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void shuffle_after_early_exit(int* out) {
  if (threadIdx.x == 5) return;  // lane 5 leaves the warp
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x), 1);
}

// Thread t reads what thread t + 1 wrote, with no barrier between.
__global__ void missing_barrier(int* out) {
  __shared__ int s[64];
  s[threadIdx.x] = static_cast<int>(threadIdx.x);
  out[threadIdx.x] = s[(threadIdx.x + 1) % 64];
}

// Each block takes the next ticket: the order in which the blocks ran.
__global__ void block_tickets(int* counter, int* ticket) {
  if (threadIdx.x == 0) ticket[blockIdx.x] = atomicAdd(counter, 1);
}

// Every thread adds its value into one float with atomicAdd: the sum's rounding follows the order.
__global__ void atomic_float_sum(float* sum, const float* x) { atomicAdd(sum, x[blockIdx.x * blockDim.x + threadIdx.x]); }

__global__ void uses_dynamic_smem(int* out) { out[threadIdx.x] = static_cast<int>(::emu::dynamic_smem()[0]); }

// One warp: D = A B through ::emu::mma_m16n8k16, the registers packed by PTX's tables ("Matrix Fragments
// for mma.m16n8k16 with floating point type"; g = lane / 4, t = lane % 4): a_i (i < 8, two per register,
// the even i in the low half) at row g for i in {0, 1, 4, 5}, else g + 8, column 2t + (i & 1), + 8 for
// i >= 4; b_i (i < 4) at row 2t + (i & 1), + 8 for i >= 2, column g; c_i at row g for i < 2, else g + 8,
// column 2t + (i & 1).
template <bool kBf16> uint32_t operand_bits(float x) {
  if constexpr (kBf16) {
    uint32_t w;
    std::memcpy(&w, &x, 4);
    return w >> 16;  // exact values: the high half is the bf16
  } else {
    const __half h = __float2half_rn(x);
    uint16_t u;
    std::memcpy(&u, &h, 2);
    return u;
  }
}
template <bool kBf16> __global__ void mma_16816(const float* A, const float* B, float* D) {
  const int lane = static_cast<int>(threadIdx.x), g = lane / 4, t = lane % 4;
  uint32_t a[4] = {0, 0, 0, 0}, b[2] = {0, 0};
  for (int i = 0; i < 8; ++i) {
    const int row = i < 2 || (i >= 4 && i < 6) ? g : g + 8, col = 2 * t + (i & 1) + (i >= 4 ? 8 : 0);
    a[i / 2] |= operand_bits<kBf16>(A[row * 16 + col]) << (16 * (i & 1));
  }
  for (int i = 0; i < 4; ++i) {
    const int row = 2 * t + (i & 1) + (i >= 2 ? 8 : 0), col = g;
    b[i / 2] |= operand_bits<kBf16>(B[row * 8 + col]) << (16 * (i & 1));
  }
  float d[4] = {0, 0, 0, 0};
  ::emu::mma_m16n8k16<kBf16>(d, a, b);
  for (int i = 0; i < 4; ++i) D[(i < 2 ? g : g + 8) * 8 + 2 * t + (i & 1)] = d[i];
}

// One warp: ::emu::ldmatrix_x4 from a [16, 24] tile of 16-bit values in shared memory (24: a padded
// leading dimension), lane L giving the address rows[L] (element offset, 16-byte aligned or not); each
// lane's four registers to out[4 L ..].
template <bool kTrans> __global__ void ldmatrix_16x24(const uint16_t* tile, const int* rows, uint32_t* out) {
  __shared__ uint16_t s[16 * 24];  // (the emulator aligns shared arrays to 16 bytes)
  const int lane = static_cast<int>(threadIdx.x);
  for (int e = lane; e < 16 * 24; e += 32) s[e] = tile[e];
  __syncwarp();
  uint32_t r[4];
  ::emu::ldmatrix_x4<kTrans>(r, s + rows[lane]);
  for (int i = 0; i < 4; ++i) out[4 * lane + i] = r[i];
}

// 64 threads per block, 16 bytes each: thread t copies its block's piece t of `src` into shared slot t
// by cp.async, then writes to out what it reads from slot t + 1 (mode 0: after wait_group 0 and a
// barrier; mode 1: after the barrier only), or (mode 2) the slot's old contents are read while a
// neighbour's copy into it may be in flight: the slots hold -2 first, thread t copies into slot t + 1,
// reads slot t at once and waits after a barrier.
__global__ void cp_async_probe(const int* src, int* out, int mode) {
  __shared__ int s[64 * 4];
  const int t = static_cast<int>(threadIdx.x), next = (t + 1) % 64;
  const int* mine = src + (static_cast<int>(blockIdx.x) * 64 + t) * 4;
  int* o = out + (static_cast<int>(blockIdx.x) * 64 + t) * 4;
  if (mode == 2) {
    for (int i = 0; i < 4; ++i) s[4 * t + i] = -2;
    __syncthreads();
    ::emu::cp_async16(s + 4 * next, mine);
    ::emu::cp_async_commit();
    for (int i = 0; i < 4; ++i) o[i] = s[4 * t + i];
    __syncthreads();  // (every read before any wait)
    ::emu::cp_async_wait(0);
    return;
  }
  ::emu::cp_async16(s + 4 * t, mine);
  ::emu::cp_async_commit();
  if (mode == 0) ::emu::cp_async_wait(0);
  __syncthreads();
  for (int i = 0; i < 4; ++i) o[i] = s[4 * next + i];
  __syncthreads();  // (every read before any thread exits: a thread's copies land when it exits)
}

template <class F> std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

}  // namespace

namespace emu_selftest {

std::string barrier_in_divergent_code() {
  int out[32] = {};
  return error_of([&] { ::barrier_in_divergent_code<<<1, 32>>>(out); });
}

std::string shuffle_after_early_exit() {
  int out[32] = {};
  return error_of([&] { ::shuffle_after_early_exit<<<1, 32>>>(out); });
}

bool missing_barrier_changes_with_order() {
  // Two launches in a row: by default block 0 runs in ascending thread order in one and descending in
  // the other (the order alternates with the launch count).
  int a[64] = {}, b[64] = {};
  ::missing_barrier<<<1, 64>>>(a);
  ::missing_barrier<<<1, 64>>>(b);
  for (int i = 0; i < 64; ++i)
    if (a[i] != b[i]) return true;
  return false;
}

std::vector<int> block_order(uint64_t schedule, int blocks) {
  const uint64_t saved = ::emu::schedule();
  ::emu::set_schedule(schedule);
  int counter = 0;
  std::vector<int> ticket(static_cast<size_t>(blocks), -1), order(static_cast<size_t>(blocks), -1);
  ::block_tickets<<<blocks, 32>>>(&counter, ticket.data());
  ::emu::set_schedule(saved);
  for (int b = 0; b < blocks; ++b)
    if (ticket[static_cast<size_t>(b)] >= 0 && ticket[static_cast<size_t>(b)] < blocks)
      order[static_cast<size_t>(ticket[static_cast<size_t>(b)])] = b;
  return order;
}

float atomic_sum(uint64_t schedule) {
  const uint64_t saved = ::emu::schedule();
  ::emu::set_schedule(schedule);
  std::vector<float> x(64 * 128);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 2654435761u) % 1000003) * (i % 3 == 0 ? 1e-3f : 1.0f);
  float sum = 0;
  ::atomic_float_sum<<<64, 128>>>(&sum, x.data());
  ::emu::set_schedule(saved);
  return sum;
}

std::vector<float> mma_m16n8k16(bool bf16, const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> d(16 * 8, -1.0f);
  if (bf16)
    ::mma_16816<true><<<1, 32>>>(a.data(), b.data(), d.data());
  else
    ::mma_16816<false><<<1, 32>>>(a.data(), b.data(), d.data());
  return d;
}

std::vector<uint32_t> ldmatrix_x4(bool trans, const std::vector<uint16_t>& tile, const std::vector<int>& rows) {
  std::vector<uint32_t> out(4 * 32, 0xdeadbeefu);
  if (trans)
    ::ldmatrix_16x24<true><<<1, 32>>>(tile.data(), rows.data(), out.data());
  else
    ::ldmatrix_16x24<false><<<1, 32>>>(tile.data(), rows.data(), out.data());
  return out;
}

std::string ldmatrix_unaligned() {
  std::vector<uint16_t> tile(16 * 24);
  std::vector<int> rows(32, 0);
  rows[3] = 4;  // 8 bytes into a row
  return error_of([&] { ldmatrix_x4(false, tile, rows); });
}

std::vector<int> cp_async(int mode, int blocks) {
  std::vector<int> src(static_cast<size_t>(blocks) * 64 * 4), out(src.size(), 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<int>(i);
  ::cp_async_probe<<<blocks, 64>>>(src.data(), out.data(), mode);
  return out;
}

std::string cp_async_unaligned() {
  std::vector<int> src(64 * 4 + 4);
  return error_of([&] {
    ::cp_async_probe<<<1, 64>>>(src.data() + 1, src.data(), 0);  // 4 bytes off
  });
}

std::string smem_without_optin() {
  int out[32] = {};
  return error_of([&] { ::uses_dynamic_smem<<<1, 32, 64 * 1024>>>(out); });
}

std::string smem_with_optin() {
  int out[32] = {};
  if (cudaFuncSetAttribute(::uses_dynamic_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 * 1024) != cudaSuccess)
    return "opt-in refused";
  return error_of([&] { ::uses_dynamic_smem<<<1, 32, 64 * 1024>>>(out); });
}

bool optin_above_limit_refused() {
  return cudaFuncSetAttribute(::uses_dynamic_smem, cudaFuncAttributeMaxDynamicSharedMemorySize, 228 * 1024) == cudaErrorInvalidValue;
}

std::string too_many_threads() {
  int out[2048] = {};
  return error_of([&] { ::uses_dynamic_smem<<<1, 2048>>>(out); });
}

}  // namespace emu_selftest
