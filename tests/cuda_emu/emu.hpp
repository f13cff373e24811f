#pragma once
// A host emulator of the CUDA execution model, force-included (g++ -include) into the Cuda backend's
// kernel sources after tests/cuda_emu/transform.py rewrote their launches `k<<<cfg>>>(args)` into
// `::emu::launch("k", k, ::emu::Config{cfg}, args)`.
//
//  * The threads of a block are cooperative fibers on the calling OS thread; blocks of a grid run one
//    after another. Shared arrays are per-declaration storage refilled with garbage at every block
//    start (transform.py rewrites them; a stray `__shared__` becomes `static`).
//  * __syncthreads releases when every live thread of the block waits on it; warp shuffles exchange
//    through a per-warp slot array between two warp barriers (released when every live lane of the
//    warp arrived). No runnable fiber while some wait = deadlock: emu::launch throws naming the kernel.
//  * Only one fiber runs at a time, so atomics are plain read-modify-writes.
//  * cp.async copies (cp_async16 below) land, in the blocks of even blockIdx.x + y + z, when issued
//    (a thread that still reads the destination's old contents without a barrier in between sees the
//    new ones), in the others only when the issuing thread's wait_group covers them, or at its exit (a
//    read the wait and a barrier do not cover sees the garbage the block started with).
//  * threadIdx/blockIdx/blockDim/gridDim are globals the scheduler sets on every switch.
//  * KILN_EMU_TRACE=1 prints every launch (kernel, grid, block) on stderr.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "emu_device.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <tuple>
#include <type_traits>
#include <utility>

// ------------------------------------------------------------------------------ CUDA keywords
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __noinline__
#undef __launch_bounds__
#undef __shared__
#undef __constant__
#undef __restrict__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __shared__ static
#define __constant__ static
#define __restrict__ __restrict

namespace emu {

// The running thread's coordinates (set by the scheduler before each switch into a fiber). Each host
// thread has its own scheduler, so host threads may launch kernels concurrently.
extern thread_local uint3 g_threadIdx, g_blockIdx;
extern thread_local dim3 g_blockDim, g_gridDim;

void sync_block();              // __syncthreads
unsigned char* dynamic_smem();  // the launch's dynamic shared memory (extern __shared__), 16-byte aligned
// Static shared arrays (__shared__ T a[N], rewritten by transform.py): one per declaration, filled with
// garbage (0xff: NaN, -1) when a block starts, so a read before the block's own write shows.
extern thread_local uint64_t g_block_epoch;
template <class Arr, int ID> Arr& block_shared() {
  struct Slot {
    alignas(16) Arr a;
    uint64_t epoch = 0;
  };
  thread_local Slot s;
  if (s.epoch != g_block_epoch) {
    std::memset(static_cast<void*>(&s.a), 0xff, sizeof(Arr));
    s.epoch = g_block_epoch;
  }
  return s.a;
}
// Every lane of the caller's warp named in `mask`; a named lane that has exited is an error (on a GPU a
// warp-synchronous operation whose mask names an exited lane is undefined): throws naming the kernel.
void sync_warp(unsigned mask);
int lane_id();                       // linear thread index % 32
unsigned char* warp_slot(int lane);  // kSlotBytes for `lane` of the caller's warp
constexpr size_t kSlotBytes = 32;    // a shuffled value (<= 16 bytes) or a lane's tensor-core fragments
// cp.async.cg.shared.global of 16 bytes (both addresses 16-byte aligned, else throws), commit_group and
// wait_group n of the calling thread; when a copy lands: the header comment.
void cp_async16(void* smem, const void* gmem);
void cp_async_commit();
void cp_async_wait(int n);

template <class T> T shfl_from(unsigned mask, T v, int src) {
  static_assert(sizeof(T) <= kSlotBytes && std::is_trivially_copyable_v<T>, "emu shuffle: type too large");
  std::memcpy(warp_slot(lane_id()), &v, sizeof(T));
  sync_warp(mask);
  T r;
  std::memcpy(&r, warp_slot(src), sizeof(T));
  sync_warp(mask);  // nobody overwrites a slot before every lane has read
  return r;
}

template <class T> dim3 to_dim3(T v) {
  if constexpr (std::is_same_v<std::decay_t<T>, dim3>) {
    return v;
  } else if constexpr (std::is_same_v<std::decay_t<T>, uint3>) {
    return dim3(v.x, v.y, v.z);
  } else {
    static_assert(std::is_integral_v<T>, "emu launch: grid/block must be an integer or dim3");
    return dim3(static_cast<unsigned>(v));
  }
}

struct Config {
  dim3 grid, block;
  size_t smem = 0;
  cudaStream_t stream = nullptr;
  template <class G, class B> Config(G g, B b, size_t sm = 0, cudaStream_t s = nullptr)
      : grid(to_dim3(g)), block(to_dim3(b)), smem(sm), stream(s) {}
};

// Runs body(ctx) for every thread of every block of the grid of kernel `fn`; throws std::runtime_error
// on an invalid configuration (CUDA's limits, including more than 48 KiB of dynamic shared memory
// without the kernel's cudaFuncAttributeMaxDynamicSharedMemorySize opt-in) or a deadlock, and rethrows
// an exception escaping a thread.
void run_grid(const char* name, const void* fn, const Config& c, void (*body)(void*), void* ctx);

// cudaFuncSetAttribute (a macro below): records a kernel's dynamic shared memory opt-in. Values above
// an H100's 227 KiB are cudaErrorInvalidValue, as on the device.
cudaError_t func_set_attribute(const void* fn, cudaFuncAttribute attr, int value);

// Launch statistics (for tests).
struct Stats {
  uint64_t launches = 0, blocks = 0, threads = 0;
  uint64_t vec_launches = 0;  // of the vectorised elementwise kernel (vec_kernel, indexing.cuh)
};
Stats& stats();
// The order in which the threads of a block run (at the start and after every barrier): a kernel that
// reads another thread's write without a barrier between them gives a different answer in one of the
// two orders. By default blocks alternate between ascending and descending thread order (by the
// parity of block index + launch count), so every kernel of a suite meets both; on: every block
// descending.
void set_reverse_order(bool on);
// A shuffled schedule: with seed != 0 every launch runs its blocks in a random order and the threads
// of each block in a random order (drawn from the seed and the launch number), so that a result which
// depends on the order of atomics or on unsynchronised reads changes with the seed. 0 (the default,
// or KILN_EMU_SCHEDULE unset) keeps grid order with alternating thread order. The environment
// variable KILN_EMU_SCHEDULE=<seed> sets it for a whole process (each host thread starts from it).
void set_schedule(uint64_t seed);
uint64_t schedule();

template <class K, class... A> void launch(const char* name, K kernel, const Config& c, A&&... args) {
  // Arguments are captured by value, like CUDA's kernel parameters.
  auto params = std::make_tuple(std::decay_t<A>(std::forward<A>(args))...);
  auto call = [&] { std::apply([&](const auto&... p) { kernel(p...); }, params); };
  run_grid(
      name, reinterpret_cast<const void*>(kernel), c, [](void* f) { (*static_cast<decltype(call)*>(f))(); }, &call);
}

}  // namespace emu

#define threadIdx (::emu::g_threadIdx)
#define blockIdx (::emu::g_blockIdx)
#define blockDim (::emu::g_blockDim)
#define gridDim (::emu::g_gridDim)

inline void __syncthreads() { ::emu::sync_block(); }
// The opt-in to more than 48 KiB of dynamic shared memory, checked by the next launch of the kernel.
#define cudaFuncSetAttribute(f, attr, v) ::emu::func_set_attribute(reinterpret_cast<const void*>(f), (attr), (v))
inline void __syncwarp(unsigned mask = 0xffffffffu) { ::emu::sync_warp(mask); }
inline void __threadfence() {}
inline void __threadfence_block() {}

template <class T> T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
  const int lane = ::emu::lane_id();
  return ::emu::shfl_from(mask, v, (lane / width) * width + ((src % width) + width) % width);
}
template <class T> T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32) {
  const int lane = ::emu::lane_id();
  int src = lane ^ lane_mask;
  if (src / width != lane / width) src = lane;
  return ::emu::shfl_from(mask, v, src);
}
template <class T> T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = ::emu::lane_id();
  const int src = (lane % width) + static_cast<int>(delta) < width ? lane + static_cast<int>(delta) : lane;
  return ::emu::shfl_from(mask, v, src);
}
template <class T> T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
  const int lane = ::emu::lane_id();
  const int src = (lane % width) >= static_cast<int>(delta) ? lane - static_cast<int>(delta) : lane;
  return ::emu::shfl_from(mask, v, src);
}

// ------------------------------------------------------------------------------ tensor cores
// Defined for backends/cuda/mma.cuh, which calls the functions below instead of its PTX.
#define KILN_CUDA_EMU 1
namespace emu {
// A float's TF32 value as the tensor cores read it: the low 13 mantissa bits ignored.
inline float tf32_operand(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u &= 0xffffe000u;
  std::memcpy(&x, &u, 4);
  return x;
}
// cvt.rna.tf32.f32: to 10 mantissa bits, nearest with ties away from zero; NaN and infinities kept.
inline float tf32_round(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0x7f800000u) return x;
  u = (u + 0x1000u) & 0xffffe000u;
  std::memcpy(&x, &u, 4);
  return x;
}
// mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32, d += A B, for the calling lane's warp, with PTX's
// fragment layout (g = lane / 4, t = lane % 4): a = A(g, t), A(g + 8, t), A(g, t + 4), A(g + 8, t + 4);
// b = B(t, g), B(t + 4, g); d = D(g, 2t), D(g, 2t + 1), D(g + 8, 2t), D(g + 8, 2t + 1). Every lane of the
// warp must call it (a warp-synchronous instruction: a missing lane is an error). Products of two TF32
// values are exact in f32; they are added to d in k order.
inline void mma_m16n8k8_tf32(float (&d)[4], const float (&a)[4], const float (&b)[2]) {
  struct Frag {
    float a[4], b[2];
  };
  static_assert(sizeof(Frag) <= kSlotBytes);
  const int lane = lane_id(), g = lane / 4, t = lane % 4;
  const Frag mine{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}};
  std::memcpy(warp_slot(lane), &mine, sizeof mine);
  sync_warp(0xffffffffu);
  float arow[2][8], bcol[2][8];
  for (int kk = 0; kk < 4; ++kk) {
    Frag f;
    std::memcpy(&f, warp_slot(g * 4 + kk), sizeof f);
    arow[0][kk] = f.a[0], arow[1][kk] = f.a[1], arow[0][kk + 4] = f.a[2], arow[1][kk + 4] = f.a[3];
    for (int e = 0; e < 2; ++e) {
      std::memcpy(&f, warp_slot((2 * t + e) * 4 + kk), sizeof f);
      bcol[e][kk] = f.b[0], bcol[e][kk + 4] = f.b[1];
    }
  }
  sync_warp(0xffffffffu);  // nobody overwrites a slot before every lane has read
  for (int r = 0; r < 2; ++r)
    for (int e = 0; e < 2; ++e) {
      float s = d[2 * r + e];
      for (int k = 0; k < 8; ++k) s += tf32_operand(arow[r][k]) * tf32_operand(bcol[e][k]);
      d[2 * r + e] = s;
    }
}
// A bf16 (kBf16) or f16 value from its 16 bits.
template <bool kBf16> inline float half_value(uint16_t u) {
  if constexpr (kBf16) {
    const uint32_t w = static_cast<uint32_t>(u) << 16;
    float x;
    std::memcpy(&x, &w, 4);
    return x;
  } else {
    __half_raw r;
    r.x = u;
    return __half2float(__half(r));
  }
}
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32, d += A B, with PTX's fragment layout
// (g = lane / 4, t = lane % 4; each register holds two values, the lower column or row in its low 16
// bits): a = {A(g, 2t..2t+1)}, {A(g + 8, 2t..2t+1)}, {A(g, 2t+8..2t+9)}, {A(g + 8, 2t+8..2t+9)};
// b = {B(2t..2t+1, g)}, {B(2t+8..2t+9, g)}; d as m16n8k8's. Every lane of the warp must call it.
// Products of two bf16 or two f16 values are exact in f32; they are added to d in k order.
template <bool kBf16> inline void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  struct Frag {
    uint32_t a[4], b[2];
  };
  static_assert(sizeof(Frag) <= kSlotBytes);
  const int lane = lane_id(), g = lane / 4, t = lane % 4;
  const Frag mine{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}};
  std::memcpy(warp_slot(lane), &mine, sizeof mine);
  sync_warp(0xffffffffu);
  auto lo = [](uint32_t r) { return half_value<kBf16>(static_cast<uint16_t>(r & 0xffffu)); };
  auto hi = [](uint32_t r) { return half_value<kBf16>(static_cast<uint16_t>(r >> 16)); };
  float arow[2][16], bcol[2][16];
  for (int kk = 0; kk < 4; ++kk) {  // the lanes g * 4 + kk hold columns 2kk, 2kk + 1, 2kk + 8, 2kk + 9 of rows g, g + 8
    Frag f;
    std::memcpy(&f, warp_slot(g * 4 + kk), sizeof f);
    for (int r = 0; r < 2; ++r) {
      arow[r][2 * kk] = lo(f.a[r]), arow[r][2 * kk + 1] = hi(f.a[r]);
      arow[r][2 * kk + 8] = lo(f.a[r + 2]), arow[r][2 * kk + 9] = hi(f.a[r + 2]);
    }
    for (int e = 0; e < 2; ++e) {  // column 2t + e of B is held by the lanes (2t + e) * 4 + kk
      std::memcpy(&f, warp_slot((2 * t + e) * 4 + kk), sizeof f);
      bcol[e][2 * kk] = lo(f.b[0]), bcol[e][2 * kk + 1] = hi(f.b[0]);
      bcol[e][2 * kk + 8] = lo(f.b[1]), bcol[e][2 * kk + 9] = hi(f.b[1]);
    }
  }
  sync_warp(0xffffffffu);  // nobody overwrites a slot before every lane has read
  for (int r = 0; r < 2; ++r)
    for (int e = 0; e < 2; ++e) {
      float s = d[2 * r + e];
      for (int k = 0; k < 16; ++k) s += arow[r][k] * bcol[e][k];
      d[2 * r + e] = s;
    }
}
// ldmatrix.sync.aligned.m8n8.x4{.trans}.shared.b16 for the calling lane's warp: four 8 x 8 matrices of
// 16-bit values, lane 8i + r giving the address of row r of matrix i (8 values, 16 bytes, 16-byte
// aligned: an unaligned row is an error, as on a GPU); register i of lane 4r + w receives values 2w
// (low 16 bits) and 2w + 1 of row r of matrix i, or with kTrans of its transpose (rows 2w and 2w + 1 of
// column r). Every lane of the warp must call it.
template <bool kTrans> inline void ldmatrix_x4(uint32_t (&r)[4], const uint16_t* p) {
  static_assert(sizeof(p) <= kSlotBytes);
  const int lane = lane_id(), g = lane / 4, t = lane % 4;
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) throw std::runtime_error("emu: ldmatrix: a row address that is not 16-byte aligned");
  std::memcpy(warp_slot(lane), &p, sizeof p);
  sync_warp(0xffffffffu);
  for (int i = 0; i < 4; ++i) {
    uint32_t v = 0;
    for (int e = 0; e < 2; ++e) {
      const int row = kTrans ? 2 * t + e : g, col = kTrans ? g : 2 * t + e;
      const uint16_t* rp = nullptr;
      std::memcpy(&rp, warp_slot(8 * i + row), sizeof rp);
      v |= static_cast<uint32_t>(rp[col]) << (16 * e);
    }
    r[i] = v;
  }
  sync_warp(0xffffffffu);  // nobody overwrites a slot before every lane has read
}
}  // namespace emu

// ------------------------------------------------------------------------------ atomics
// One fiber runs at a time and never yields inside these: a plain read-modify-write is atomic.
inline float atomicAdd(float* p, float v) {
  const float o = *p;
  *p = o + v;
  return o;
}
inline double atomicAdd(double* p, double v) {
  const double o = *p;
  *p = o + v;
  return o;
}
inline int atomicAdd(int* p, int v) {
  const int o = *p;
  *p = static_cast<int>(static_cast<unsigned>(o) + static_cast<unsigned>(v));
  return o;
}
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  const unsigned o = *p;
  *p = o + v;
  return o;
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {  // NOLINT(google-runtime-int)
  const unsigned long long o = *p;                                                  // NOLINT(google-runtime-int)
  *p = o + v;
  return o;
}
inline __nv_bfloat16 atomicAdd(__nv_bfloat16* p, __nv_bfloat16 v) {
  const __nv_bfloat16 o = *p;
  *p = __float2bfloat16_rn(__bfloat162float(o) + __bfloat162float(v));
  return o;
}
inline __half atomicAdd(__half* p, __half v) {
  const __half o = *p;
  *p = __float2half_rn(__half2float(o) + __half2float(v));
  return o;
}
inline int atomicMax(int* p, int v) {
  const int o = *p;
  if (v > o) *p = v;
  return o;
}
inline int atomicOr(int* p, int v) {
  const int o = *p;
  *p = o | v;
  return o;
}
inline int atomicExch(int* p, int v) {
  const int o = *p;
  *p = v;
  return o;
}
inline int atomicCAS(int* p, int cmp, int v) {
  const int o = *p;
  if (o == cmp) *p = v;
  return o;
}

// ------------------------------------------------------------------------------ runtime calls
// Kernel-only emulation (test_cuda_emu, whose buffers are plain host memory): stream-ordered copies
// and fills become synchronous host calls. The emulated device (KILN_EMU_CUDART) links emu_cudart.cpp,
// whose cudaMemcpyAsync/cudaMemsetAsync check their ranges against the live device allocations.
#if !defined(KILN_EMU_CUDART)
#define cudaMemsetAsync(p, v, n, ...) (std::memset((p), (v), (n)), cudaSuccess)
#define cudaMemcpyAsync(d, s, n, ...) (std::memmove((d), (s), (n)), cudaSuccess)
#endif

using std::max;
using std::min;
