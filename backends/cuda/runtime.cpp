// Devices, streams, library handles, the caching allocators and host <-> device copies.
#include "kiln/backends/cuda/runtime.hpp"

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/backends/cuda/cuda.hpp"
#include "kiln/core/error.hpp"
#include "kiln/core/profile.hpp"

namespace kiln::cuda {

void raise_cuda(cudaError_t e, std::string_view op, const char* call, const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  fail("{}: CUDA error {} ({}): {} [{} at {}:{}]", op, cudaGetErrorName(e), static_cast<int>(e), cudaGetErrorString(e), call,
       base ? base + 1 : file, line);
}

void raise_cublas(cublasStatus_t s, std::string_view op, const char* call, const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  fail("{}: cuBLAS error {} ({}) [{} at {}:{}]", op, cublasGetStatusName(s), cublasGetStatusString(s), call, base ? base + 1 : file, line);
}

namespace {

constexpr int kMaxDevices = 64;
// cuBLAS's workspace per device, given to it (cublasSetWorkspace) so that it is stream-ordered on
// kiln's stream instead of allocated by cuBLAS on first use; 32 MiB is NVIDIA's recommendation for Hopper.
constexpr size_t kBlasWorkspace = size_t{32} << 20;

bool env_flag(const char* name) {
  const char* e = std::getenv(name);
  return e && *e && std::string(e) != "0";
}

bool sync_after_launch() {
  static const bool on = env_flag("KILN_CUDA_SYNC");
  return on;
}

struct Probe {
  int count = 0;
  std::string reason;
};
const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    const cudaError_t e = cudaGetDeviceCount(&r.count);
    if (e != cudaSuccess) {
      r.count = 0;
      r.reason = fmt::format("{}: {}", cudaGetErrorName(e), cudaGetErrorString(e));
      (void)cudaGetLastError();  // clear it: this is not a sticky error
    } else if (r.count == 0) {
      r.reason = "no device visible";
    }
    return r;
  }();
  return p;
}

thread_local int t_device = 0;
std::atomic<bool> g_tf32{false};
std::atomic<bool> g_attention_tc{true};
std::atomic<bool> g_attention_half{true};
std::atomic<int> g_attention_rows{0};

// One device's state, created on first use and never destroyed: storage freed during static
// destruction still finds its allocator, and the driver reclaims everything at exit.
struct DeviceState {
  int device = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  void* blas_workspace = nullptr;
  cudaDeviceProp prop{};
  std::unique_ptr<CachingAllocator> alloc;
};

std::array<std::once_flag, kMaxDevices> g_once;
std::array<DeviceState*, kMaxDevices> g_state{};

void* raw_malloc(int device, size_t bytes) {
  void* p = nullptr;
  KILN_CUDA_CHECK_OP("cuda allocate", cudaSetDevice(device));
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return nullptr;
  }
  KILN_CUDA_CHECK_OP("cuda allocate", e);
  return p;
}

DeviceState& state(int device) {
  KILN_CHECK(device >= 0 && device < kMaxDevices, "cuda: device index {} out of range", device);
  std::call_once(g_once[static_cast<size_t>(device)], [device] {
    auto* s = new DeviceState;
    s->device = device;
    KILN_CUDA_CHECK_OP("cuda init", cudaSetDevice(device));
    KILN_CUDA_CHECK_OP("cuda init", cudaGetDeviceProperties(&s->prop, device));
    KILN_CUDA_CHECK_OP("cuda init", cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
    KILN_CUBLAS_CHECK_OP("cuda init", cublasCreate(&s->blas));
    KILN_CUBLAS_CHECK_OP("cuda init", cublasSetStream(s->blas, s->stream));
    KILN_CUDA_CHECK_OP("cuda init", cudaMalloc(&s->blas_workspace, kBlasWorkspace));
    KILN_CUBLAS_CHECK_OP("cuda init", cublasSetWorkspace(s->blas, s->blas_workspace, kBlasWorkspace));
    s->alloc = std::make_unique<CachingAllocator>(
        fmt::format("cuda:{} allocator", device), [device](size_t n) { return raw_malloc(device, n); },
        [device](void* p) {
          (void)cudaSetDevice(device);
          (void)cudaFree(p);
        },
        env_flag("KILN_CUDA_NO_CACHE") ? CachingAllocator::Mode::exact : CachingAllocator::Mode::caching);
    g_state[static_cast<size_t>(device)] = s;
  });
  return *g_state[static_cast<size_t>(device)];
}

DeviceState& current(std::string_view op) { return state(require_device(op)); }

// kiln::profile's timer for Cuda ops (core/profile.hpp): a pair of events recorded on the current
// device's stream around each op, read when the profile is reported, so that recording never waits
// for the device. Events are reused from a pool per device (an event is recorded on its own device).
struct ProfEvent {
  cudaEvent_t event = nullptr;
  int device = 0;
};
std::mutex g_prof_mu;
// Never destroyed, as the device states: the pooled events stay reachable to the end (a pool destroyed
// at exit left them unreachable, a leak LeakSanitizer reported) and a late release finds the pool.
auto& g_prof_pool = *new std::array<std::vector<ProfEvent*>, kMaxDevices>;

void* prof_record() noexcept {
  try {
    const int d = require_device("profile");
    ProfEvent* e = nullptr;
    {
      std::lock_guard lock(g_prof_mu);
      auto& pool = g_prof_pool[static_cast<size_t>(d)];
      if (!pool.empty()) {
        e = pool.back();
        pool.pop_back();
      }
    }
    if (!e) {
      e = new ProfEvent{nullptr, d};
      KILN_CUDA_CHECK_OP("profile", cudaEventCreate(&e->event));
    }
    KILN_CUDA_CHECK_OP("profile", cudaEventRecord(e->event, stream()));
    return e;
  } catch (const std::exception&) {
    (void)cudaGetLastError();
    return nullptr;  // the op is then timed on the host only
  }
}
bool prof_elapsed(void* a, void* b, float* ms) noexcept {
  auto* x = static_cast<ProfEvent*>(a);
  auto* y = static_cast<ProfEvent*>(b);
  if (!x || !y || x->device != y->device) return false;
  if (cudaEventSynchronize(y->event) != cudaSuccess || cudaEventElapsedTime(ms, x->event, y->event) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return true;
}
void prof_release(void* p) noexcept {
  auto* e = static_cast<ProfEvent*>(p);
  if (!e) return;
  std::lock_guard lock(g_prof_mu);
  g_prof_pool[static_cast<size_t>(e->device)].push_back(e);
}
[[maybe_unused]] const bool g_prof_registered = [] {
  profile::register_device_timer(Cuda::name, {prof_record, prof_elapsed, prof_release});
  return true;
}();

}  // namespace

void after_launch(std::string_view op, const char* file, int line) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) raise_cuda(e, op, "kernel launch", file, line);
  if (sync_after_launch()) {
    const cudaError_t s = cudaStreamSynchronize(stream());
    if (s != cudaSuccess) raise_cuda(s, op, "kernel execution (KILN_CUDA_SYNC)", file, line);
  }
}

int require_device(std::string_view op) {
  const Probe& p = probe();
  if (p.count == 0) fail("{}: no CUDA device ({})", op, p.reason);
  KILN_CHECK(t_device < p.count, "{}: device {} selected but only {} CUDA device(s) visible", op, t_device, p.count);
  int cur = -1;
  KILN_CUDA_CHECK_OP(op, cudaGetDevice(&cur));
  if (cur != t_device) KILN_CUDA_CHECK_OP(op, cudaSetDevice(t_device));
  return t_device;
}

void check_device(const CudaStorage& s, std::string_view op) {
  const int d = require_device(op);
  KILN_CHECK(s.device() == d,
             "{}: tensor lives on cuda:{} but the current device is cuda:{} (move it with to<Cpu>() and back, or set_device)", op,
             s.device(), d);
}

cudaStream_t stream() { return current("cuda").stream; }
cublasHandle_t cublas() { return current("cuda").blas; }
const cudaDeviceProp& device_properties() { return current("cuda").prop; }

// ------------------------------------------------------------------------------------ user API
bool available() { return probe().count > 0; }
int device_count() { return probe().count; }
std::string unavailable_reason() { return probe().reason; }
void set_device(int device) {
  KILN_CHECK(device >= 0 && device < probe().count, "cuda::set_device: device {} does not exist ({} visible{}{})", device, probe().count,
             probe().reason.empty() ? "" : "; ", probe().reason);
  t_device = device;
}
int current_device() { return t_device; }
std::string device_name(int device) {
  if (device < 0) device = require_device("cuda::device_name");
  KILN_CHECK(device < probe().count, "cuda::device_name: device {} does not exist ({} visible)", device, probe().count);
  return state(device).prop.name;
}
void synchronize() { KILN_CUDA_CHECK_OP("cuda::synchronize", cudaStreamSynchronize(stream())); }
MemoryStats memory_stats() { return current("cuda::memory_stats").alloc->stats(); }
void reset_peak_memory_stats() { current("cuda::reset_peak_memory_stats").alloc->reset_peak(); }
void empty_cache() {
  DeviceState& s = current("cuda::empty_cache");
  KILN_CUDA_CHECK_OP("cuda::empty_cache", cudaStreamSynchronize(s.stream));
  s.alloc->empty_cache();
}
void set_allow_tf32(bool allow) { g_tf32 = allow; }
bool allow_tf32() { return g_tf32; }
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

// ------------------------------------------------------------------------------------ storage
CudaStorage::~CudaStorage() {
  if (block_.ptr) cuda::state(device_).alloc->release(block_, bytes_);
}

std::shared_ptr<CudaStorage> Cuda::allocate(size_t bytes) {
  const int d = cuda::require_device("allocate");
  return std::make_shared<CudaStorage>(cuda::state(d).alloc->allocate(bytes), bytes, d);
}

void Cuda::write(Storage& s, size_t off, const void* src, size_t n) {
  KILN_CHECK(off + n <= s.bytes(), "write: {} bytes at offset {} overflow a storage of {} bytes", n, off, s.bytes());
  if (!n) return;
  cuda::check_device(s, "write");
  const cudaStream_t st = cuda::stream();
  // the host buffer may be freed as soon as we return: wait for the copy
  KILN_CUDA_CHECK_OP("write", cudaMemcpyAsync(static_cast<char*>(s.data()) + off, src, n, cudaMemcpyHostToDevice, st));
  KILN_CUDA_CHECK_OP("write", cudaStreamSynchronize(st));
}

void Cuda::read(const Storage& s, size_t off, void* dst, size_t n) {
  KILN_CHECK(off + n <= s.bytes(), "read: {} bytes at offset {} overflow a storage of {} bytes", n, off, s.bytes());
  if (!n) return;
  cuda::check_device(s, "read");
  const cudaStream_t st = cuda::stream();
  KILN_CUDA_CHECK_OP("read", cudaMemcpyAsync(dst, static_cast<const char*>(s.data()) + off, n, cudaMemcpyDeviceToHost, st));
  KILN_CUDA_CHECK_OP("read", cudaStreamSynchronize(st));
}

}  // namespace kiln
