// The emulated device's CUDA runtime: the subset of libcudart that kiln's Cuda backend calls
// (backends/cuda/runtime.cpp, the kernels' copies and fills), implemented on the host. Linked instead
// of libcudart into the emulated-device build (tests/cuda_emu/CMakeLists.txt), where kernels run on
// emu.hpp's fibers, so the whole backend (allocator, runtime, cuBLAS calls, kernels) runs without a GPU.
//
//  * One device, emu::device_properties() (emu.hpp): an H100's limits, 4 SMs, 4 GiB of memory (a
//    larger request is out of memory).
//  * Device memory is host memory (256-byte aligned, as cudaMalloc's), filled with 0xff (NaN, -1) when allocated: kernels must not rely on
//    zeroed memory. Every live allocation is recorded; copies and fills check that the device range
//    they touch lies inside one live allocation, and a failed check returns cudaErrorInvalidValue
//    after naming the call and the range on stderr (real CUDA would fault or corrupt memory).
//  * Streams are handles; work runs synchronously on the calling thread, so "stream order" is trivial.
//  * The last error is per host thread, as in CUDA. Sticky (context-corrupting) errors are not modelled.
//  * The runtime's teardown at exit: CUDA's runtime registers it when it initialises (the first call that
//    needs the device), so it runs before exit handlers registered earlier (at the program's static
//    start-up), and events then answer cudaErrorCudartUnloading. Modelled for events only: an H100 run
//    showed KILN_PROFILE=1's exit report losing every device time to it (docs/profiling.md).
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "emu_device.hpp"

namespace {

constexpr size_t kDeviceMemory = emu::kTotalMemory;

struct Registry {
  std::mutex mu;
  std::map<const char*, size_t> live;  // base -> bytes
  size_t bytes = 0;
  std::set<cudaStream_t> streams;
};
Registry& reg() {
  static Registry* r = new Registry;  // never destroyed: storage freed during static destruction still finds it
  return *r;
}

thread_local cudaError_t t_last = cudaSuccess;
thread_local int t_device = 0;

std::atomic<bool> g_unloading{false};
// Called by the calls that initialise the real runtime (device selection, allocation, streams, events).
void init_runtime() {
  static const bool once = [] {
    std::atexit([] { g_unloading = true; });
    return true;
  }();
  (void)once;
}
// After the teardown: the error, without the emulator's message (a real runtime prints nothing).
cudaError_t unloading() {
  t_last = cudaErrorCudartUnloading;
  return cudaErrorCudartUnloading;
}

cudaError_t fail(cudaError_t e, const std::string& what) {
  std::fprintf(stderr, "emu cuda: %s\n", what.c_str());
  t_last = e;
  return e;
}

// The live allocation holding p, or live.end(); caller holds the lock.
std::map<const char*, size_t>::const_iterator find_locked(const void* p) {
  const auto& live = reg().live;
  const char* c = static_cast<const char*>(p);
  auto it = live.upper_bound(c);
  if (it == live.begin()) return live.end();
  --it;
  return c <= it->first + it->second ? it : live.end();
}

std::string hex(const void* p) {
  char b[32];
  std::snprintf(b, sizeof b, "%p", p);
  return b;
}

}  // namespace

namespace emu::device {

bool contains(const void* p, size_t bytes) {
  std::lock_guard<std::mutex> lk(reg().mu);
  const auto it = find_locked(p);
  if (it == reg().live.end()) return false;
  const size_t off = static_cast<size_t>(static_cast<const char*>(p) - it->first);
  return off <= it->second && bytes <= it->second - off;
}

std::string describe(const void* p) {
  std::lock_guard<std::mutex> lk(reg().mu);
  const auto it = find_locked(p);
  if (it == reg().live.end()) return hex(p) + " (not device memory)";
  return hex(p) + " (offset " + std::to_string(static_cast<const char*>(p) - it->first) + " in a device buffer of " +
         std::to_string(it->second) + " bytes)";
}

size_t live_allocations() {
  std::lock_guard<std::mutex> lk(reg().mu);
  return reg().live.size();
}

size_t live_bytes() {
  std::lock_guard<std::mutex> lk(reg().mu);
  return reg().bytes;
}

std::atomic<uint64_t> g_host_waits{0};
uint64_t host_waits() { return g_host_waits.load(); }

}  // namespace emu::device

namespace {

bool device_range(const void* p, size_t n) { return emu::device::contains(p, n); }

cudaError_t check_stream(cudaStream_t s, const char* call) {
  if (!s) return cudaSuccess;
  std::lock_guard<std::mutex> lk(reg().mu);
  if (!reg().streams.count(s)) return fail(cudaErrorInvalidResourceHandle, std::string(call) + ": unknown stream " + hex(s));
  return cudaSuccess;
}

}  // namespace

// ------------------------------------------------------------------------------------ errors
cudaError_t CUDARTAPI cudaGetLastError(void) {
  const cudaError_t e = t_last;
  t_last = cudaSuccess;
  return e;
}
cudaError_t CUDARTAPI cudaPeekAtLastError(void) { return t_last; }

const char* CUDARTAPI cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorCudartUnloading:
      return "cudaErrorCudartUnloading";
    default:
      return "cudaErrorUnknown";
  }
}
const char* CUDARTAPI cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    case cudaErrorCudartUnloading:
      return "driver shutting down";
    default:
      return "unknown error";
  }
}

// ------------------------------------------------------------------------------------ devices
cudaError_t CUDARTAPI cudaGetDeviceCount(int* count) {
  if (!count) return fail(cudaErrorInvalidValue, "cudaGetDeviceCount: null pointer");
  *count = 1;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaSetDevice(int device) {
  init_runtime();
  if (device != 0) return fail(cudaErrorInvalidDevice, "cudaSetDevice: device " + std::to_string(device) + " (the emulator has one)");
  t_device = device;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaGetDevice(int* device) {
  if (!device) return fail(cudaErrorInvalidValue, "cudaGetDevice: null pointer");
  *device = t_device;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (!p) return fail(cudaErrorInvalidValue, "cudaGetDeviceProperties: null pointer");
  if (device != 0) return fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties: device " + std::to_string(device));
  *p = emu::device_properties();
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaDeviceSynchronize(void) {
  ++emu::device::g_host_waits;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaMemGetInfo(size_t* free_b, size_t* total) {
  if (!free_b || !total) return fail(cudaErrorInvalidValue, "cudaMemGetInfo: null pointer");
  *total = kDeviceMemory;
  *free_b = kDeviceMemory - emu::device::live_bytes();
  return cudaSuccess;
}

// ------------------------------------------------------------------------------------ streams
cudaError_t CUDARTAPI cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
  init_runtime();
  if (!s) return fail(cudaErrorInvalidValue, "cudaStreamCreateWithFlags: null pointer");
  *s = reinterpret_cast<cudaStream_t>(new char[1]);
  std::lock_guard<std::mutex> lk(reg().mu);
  reg().streams.insert(*s);
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaStreamSynchronize(cudaStream_t s) {
  ++emu::device::g_host_waits;
  return check_stream(s, "cudaStreamSynchronize");
}

// ------------------------------------------------------------------------------------ memory
cudaError_t CUDARTAPI cudaMalloc(void** p, size_t bytes) {
  init_runtime();
  if (!p) return fail(cudaErrorInvalidValue, "cudaMalloc: null pointer");
  *p = nullptr;
  {
    std::lock_guard<std::mutex> lk(reg().mu);
    if (bytes > kDeviceMemory - reg().bytes) {
      t_last = cudaErrorMemoryAllocation;  // not an emulator complaint: the allocator handles it
      return cudaErrorMemoryAllocation;
    }
  }
  void* raw = nullptr;  // 256-byte aligned, like cudaMalloc; exactly `bytes` long (for AddressSanitizer)
  char* m = posix_memalign(&raw, 256, bytes ? bytes : 1) == 0 ? static_cast<char*>(raw) : nullptr;
  if (!m) {
    t_last = cudaErrorMemoryAllocation;
    return cudaErrorMemoryAllocation;
  }
  std::memset(m, 0xff, bytes);
  std::lock_guard<std::mutex> lk(reg().mu);
  reg().live.emplace(m, bytes);
  reg().bytes += bytes;
  *p = m;
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaFree(void* p) {
  if (!p) return cudaSuccess;
  bool known = false;
  {
    std::lock_guard<std::mutex> lk(reg().mu);
    const auto it = reg().live.find(static_cast<const char*>(p));
    if (it != reg().live.end()) {
      known = true;
      reg().bytes -= it->second;
      reg().live.erase(it);
    }
  }
  if (!known) return fail(cudaErrorInvalidValue, "cudaFree: " + hex(p) + " is not the start of a live device allocation");
  std::free(p);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t s) {
  if (const cudaError_t e = check_stream(s, "cudaMemcpyAsync"); e != cudaSuccess) return e;
  if (n == 0) return cudaSuccess;
  const bool dd = device_range(dst, n), sd = device_range(src, n);
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToDevice:
      ok = dd;
      break;
    case cudaMemcpyDeviceToHost:
      ok = sd;
      break;
    case cudaMemcpyDeviceToDevice:
      ok = dd && sd;
      break;
    case cudaMemcpyHostToHost:
      ok = true;
      break;
    default:
      ok = true;
      break;  // cudaMemcpyDefault: any mix
  }
  if (!ok)
    return fail(cudaErrorInvalidValue, "cudaMemcpyAsync(kind " + std::to_string(static_cast<int>(kind)) + ") of " + std::to_string(n) +
                                           " bytes: destination " + emu::device::describe(dst) + ", source " + emu::device::describe(src) +
                                           ": a device range outside every live allocation");
  const char* d = static_cast<const char*>(dst);
  const char* c = static_cast<const char*>(src);
  if (d != c && d < c + n && c < d + n)
    return fail(cudaErrorInvalidValue, "cudaMemcpyAsync: " + std::to_string(n) + " bytes between overlapping ranges " + hex(dst) + " and " +
                                           hex(src) + " (undefined in CUDA)");
  if (d != c) std::memcpy(dst, src, n);
  return cudaSuccess;
}

cudaError_t CUDARTAPI cudaMemsetAsync(void* p, int value, size_t n, cudaStream_t s) {
  if (const cudaError_t e = check_stream(s, "cudaMemsetAsync"); e != cudaSuccess) return e;
  if (n == 0) return cudaSuccess;
  if (!device_range(p, n))
    return fail(cudaErrorInvalidValue,
                "cudaMemsetAsync of " + std::to_string(n) + " bytes at " + emu::device::describe(p) + ": outside every live allocation");
  std::memset(p, value, n);
  return cudaSuccess;
}

// ------------------------------------------------------------------------------------ events
// Work is synchronous here: an event records the host clock when recorded.
struct CUevent_st {
  std::chrono::steady_clock::time_point t{};
  bool recorded = false;
};
cudaError_t CUDARTAPI cudaEventCreate(cudaEvent_t* e) {
  init_runtime();
  if (g_unloading) return unloading();
  if (!e) return fail(cudaErrorInvalidValue, "cudaEventCreate: null pointer");
  *e = new CUevent_st;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaEventDestroy(cudaEvent_t e) {
  if (!e) return fail(cudaErrorInvalidResourceHandle, "cudaEventDestroy: null event");
  delete e;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (g_unloading) return unloading();
  if (!e) return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord: null event");
  if (const cudaError_t r = check_stream(s, "cudaEventRecord"); r != cudaSuccess) return r;
  e->t = std::chrono::steady_clock::now();
  e->recorded = true;
  return cudaSuccess;
}
cudaError_t CUDARTAPI cudaEventSynchronize(cudaEvent_t e) {
  if (g_unloading) return unloading();
  ++emu::device::g_host_waits;
  return e ? cudaSuccess : fail(cudaErrorInvalidResourceHandle, "cudaEventSynchronize: null event");
}
// Work already ran (synchronously): a recorded event is complete, and waiting for one is ordering
// that holds already. Both still check their handles, as CUDA does.
cudaError_t CUDARTAPI cudaEventQuery(cudaEvent_t e) {
  return e ? cudaSuccess : fail(cudaErrorInvalidResourceHandle, "cudaEventQuery: null event");
}
cudaError_t CUDARTAPI cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  if (!e) return fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: null event");
  if (flags != 0 && flags != cudaEventWaitExternal) return fail(cudaErrorInvalidValue, "cudaStreamWaitEvent: unknown flags");
  return check_stream(s, "cudaStreamWaitEvent");
}
cudaError_t CUDARTAPI cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  if (g_unloading) return unloading();
  if (!ms || !a || !b) return fail(cudaErrorInvalidValue, "cudaEventElapsedTime: null argument");
  if (!a->recorded || !b->recorded) return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event was never recorded");
  *ms = std::chrono::duration<float, std::milli>(b->t - a->t).count();
  return cudaSuccess;
}
