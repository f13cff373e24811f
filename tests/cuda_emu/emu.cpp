// The fiber scheduler of the CUDA host emulator (emu.hpp).
#include "emu.hpp"

#include <sys/mman.h>
#include <unistd.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace emu {

thread_local uint3 g_threadIdx, g_blockIdx;
thread_local uint64_t g_block_epoch = 0;
thread_local dim3 g_blockDim, g_gridDim;

namespace {

constexpr size_t kStack = size_t{256} << 10;  // per fiber, with a guard page below
constexpr int kWarp = 32;

enum class St : uint8_t { runnable, wait_block, wait_warp, done };

// A fiber's saved context. On x86-64 a context switch is a few instructions (emu_switch below: the
// callee-saved registers, MXCSR and the x87 control word on the fiber's own stack); elsewhere
// ucontext, whose swapcontext costs two system calls (the signal mask) per switch.
#if defined(__x86_64__)
struct Ctx {
  void* sp = nullptr;
};
extern "C" void emu_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .p2align 4
  .globl emu_switch
  .hidden emu_switch
  .type emu_switch, @function
emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_switch, .-emu_switch
)");
void switch_ctx(Ctx& from, Ctx& to) { emu_switch(&from.sp, to.sp); }
#else
struct Ctx {
  ucontext_t uc;
};
void switch_ctx(Ctx& from, Ctx& to) { swapcontext(&from.uc, &to.uc); }
#endif

// A cp.async copy not landed yet: 16 bytes.
struct AsyncCopy {
  void* dst;
  const void* src;
};

struct Fiber {
  Ctx ctx;
  char* mem = nullptr;  // guard page + stack
  St st = St::done;
  uint3 tid{};
  std::vector<AsyncCopy> open;                 // cp.async copies since the last commit (late blocks only)
  std::vector<std::vector<AsyncCopy>> groups;  // committed groups in flight, oldest first
};

struct Sched {
  Ctx main;
  std::vector<Fiber> fib;  // grows, never shrinks (stacks are reused)
  int n = 0;               // threads of the current block
  int cur = -1;
  int live = 0, block_wait = 0;
  std::vector<int> warp_live, warp_wait;
  std::vector<unsigned> warp_mask;   // lanes named by the masks of the warp operation now waiting
  std::vector<unsigned char> slots;  // per warp: 32 lanes x kSlotBytes
  void (*body)(void*) = nullptr;
  void* ctx = nullptr;
  std::exception_ptr exc;
  Stats stats;
  bool copies_late = false;  // this block's cp.async copies land at the waits (emu.hpp)
};
thread_local Sched g;
thread_local bool g_reverse = false;  // every block in reverse order; else blocks alternate (see emu.hpp)
// A shuffled schedule (emu.hpp, set_schedule); 0: blocks in grid order, threads alternating.
uint64_t schedule_from_env() {
  const char* e = std::getenv("KILN_EMU_SCHEDULE");
  return e && *e ? std::strtoull(e, nullptr, 10) : 0;
}
thread_local uint64_t g_schedule = schedule_from_env();

// Dynamic shared memory opt-ins (cudaFuncSetAttribute), by kernel.
std::mutex g_attr_mu;
std::map<const void*, int> g_max_dynamic_smem;

void release_block() {
  if (g.block_wait > 0 && g.block_wait == g.live) {
    for (int i = 0; i < g.n; ++i)
      if (g.fib[static_cast<size_t>(i)].st == St::wait_block) g.fib[static_cast<size_t>(i)].st = St::runnable;
    g.block_wait = 0;
  }
}
void release_warp(int w) {
  const auto wi = static_cast<size_t>(w);
  if (g.warp_wait[wi] > 0 && g.warp_wait[wi] == g.warp_live[wi]) {
    const int lo = w * kWarp, hi = std::min(g.n, lo + kWarp);
    for (int i = lo; i < hi; ++i)
      if (g.fib[static_cast<size_t>(i)].st == St::wait_warp) g.fib[static_cast<size_t>(i)].st = St::runnable;
    g.warp_wait[wi] = 0;
    g.warp_mask[wi] = 0;
  }
}

// Under AddressSanitizer every stack switch is announced (start) and confirmed (finish), so that ASan
// knows which stack is live; main_bottom/main_size (the launching thread's stack) come from the first
// confirmation inside a fiber.
#if defined(__SANITIZE_ADDRESS__)
thread_local const void* g_main_bottom = nullptr;
thread_local size_t g_main_size = 0;
#endif

void yield_to_main() {
#if defined(__SANITIZE_ADDRESS__)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, g_main_bottom, g_main_size);
#endif
  switch_ctx(g.fib[static_cast<size_t>(g.cur)].ctx, g.main);
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_finish_switch_fiber(fake, &g_main_bottom, &g_main_size);
#endif
}

void resume(Fiber& f) {
#if defined(__SANITIZE_ADDRESS__)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.mem + sysconf(_SC_PAGESIZE), kStack);
#endif
  switch_ctx(g.main, f.ctx);
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

// Lands `f`'s committed cp.async groups but the newest `keep`.
void land_groups(Fiber& f, size_t keep) {
  const size_t n = f.groups.size() > keep ? f.groups.size() - keep : 0;
  for (size_t i = 0; i < n; ++i)
    for (const AsyncCopy& c : f.groups[i]) std::memcpy(c.dst, c.src, 16);
  f.groups.erase(f.groups.begin(), f.groups.begin() + static_cast<std::ptrdiff_t>(n));
}

void entry() {
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_finish_switch_fiber(nullptr, &g_main_bottom, &g_main_size);
#endif
  try {
    g.body(g.ctx);
  } catch (...) {
    if (!g.exc) g.exc = std::current_exception();
  }
  Fiber& f = g.fib[static_cast<size_t>(g.cur)];
  f.groups.push_back(std::move(f.open));  // a thread's copies complete after it exits, too
  f.open.clear();
  land_groups(f, 0);
  f.st = St::done;
  const auto wi = static_cast<size_t>(g.cur / kWarp);
  if (g.warp_wait[wi] > 0 && ((g.warp_mask[wi] >> (g.cur % kWarp)) & 1u) && !g.exc)
    g.exc = std::make_exception_ptr(std::runtime_error("emu: lane " + std::to_string(g.cur % kWarp) + " of warp " +
                                                       std::to_string(g.cur / kWarp) +
                                                       " exited while other lanes wait for it in a warp shuffle or __syncwarp "
                                                       "(undefined on a GPU)"));
  --g.live;
  --g.warp_live[static_cast<size_t>(g.cur / kWarp)];
  release_block();
  release_warp(g.cur / kWarp);
#if defined(__SANITIZE_ADDRESS__)
  __sanitizer_start_switch_fiber(nullptr, g_main_bottom, g_main_size);  // this stack is done
#endif
  switch_ctx(f.ctx, g.main);  // never resumed
}

char* new_stack() {
  const long page = sysconf(_SC_PAGESIZE);
  void* p = mmap(nullptr, kStack + static_cast<size_t>(page), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw std::runtime_error("emu: cannot allocate a fiber stack");
  mprotect(p, static_cast<size_t>(page), PROT_NONE);  // guard page: a stack overflow faults
  return static_cast<char*>(p);
}

// Thread i of the block, ready to run from the start (out of line: getcontext returns twice).
[[gnu::noinline]] void start_fiber(int i, dim3 block, long page) {
  Fiber& f = g.fib[static_cast<size_t>(i)];
#if defined(__SANITIZE_ADDRESS__)
  // the previous thread on this stack never returned from its frames: clear their redzones
  __asan_unpoison_memory_region(f.mem + page, kStack);
#endif
#if defined(__x86_64__)
  // The stack emu_switch pops into entry(): MXCSR / x87 control word, six callee-saved registers,
  // entry's address, and a null return address at a 16-byte boundary - 8, as after a call.
  auto* top = reinterpret_cast<uint64_t*>(f.mem + page + kStack);
  uint64_t* sp = top - 9;
  uint32_t csr[2];
  asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(csr[0]), "=m"(csr[1]));
  std::memcpy(&sp[0], csr, 8);
  for (int r = 1; r <= 6; ++r) sp[r] = 0;
  sp[7] = reinterpret_cast<uint64_t>(&entry);
  sp[8] = 0;
  f.ctx.sp = sp;
#else
  getcontext(&f.ctx.uc);
  f.ctx.uc.uc_stack.ss_sp = f.mem + page;
  f.ctx.uc.uc_stack.ss_size = kStack;
  f.ctx.uc.uc_link = nullptr;
  makecontext(&f.ctx.uc, entry, 0);
#endif
  f.st = St::runnable;
  f.open.clear();
  f.groups.clear();
  const auto u = static_cast<unsigned>(i);
  f.tid = uint3{u % block.x, (u / block.x) % block.y, u / (block.x * block.y)};
  ++g.warp_live[static_cast<size_t>(i / kWarp)];
}

}  // namespace

Stats& stats() { return g.stats; }
void set_reverse_order(bool on) { g_reverse = on; }
void set_schedule(uint64_t seed) { g_schedule = seed; }
uint64_t schedule() { return g_schedule; }

int lane_id() { return g.cur % kWarp; }

void cp_async16(void* smem, const void* gmem) {
  if (reinterpret_cast<uintptr_t>(smem) % 16 != 0 || reinterpret_cast<uintptr_t>(gmem) % 16 != 0)
    throw std::runtime_error("emu: cp.async of 16 bytes from or to an address that is not 16-byte aligned");
  if (g.copies_late)
    g.fib[static_cast<size_t>(g.cur)].open.push_back({smem, gmem});
  else
    std::memcpy(smem, gmem, 16);
}
void cp_async_commit() {
  Fiber& f = g.fib[static_cast<size_t>(g.cur)];
  f.groups.push_back(std::move(f.open));
  f.open.clear();
}
void cp_async_wait(int n) { land_groups(g.fib[static_cast<size_t>(g.cur)], static_cast<size_t>(std::max(n, 0))); }

unsigned char* warp_slot(int lane) {
  return g.slots.data() + (static_cast<size_t>(g.cur / kWarp) * kWarp + static_cast<size_t>(lane)) * kSlotBytes;
}

// Dynamic shared memory of the running launch (extern __shared__ arrays; transform.py).
thread_local std::vector<unsigned char> g_smem;
thread_local size_t g_smem_bytes = 0;
unsigned char* dynamic_smem() {
  if (g_smem_bytes == 0) throw std::runtime_error("emu: a kernel uses dynamic shared memory but its launch gave none");
  return g_smem.data();
}

void sync_block() {
  Fiber& f = g.fib[static_cast<size_t>(g.cur)];
  f.st = St::wait_block;
  ++g.block_wait;
  release_block();
  if (f.st != St::runnable) yield_to_main();
}

void sync_warp(unsigned mask) {
  Fiber& f = g.fib[static_cast<size_t>(g.cur)];
  const int w = g.cur / kWarp;
  const auto wi = static_cast<size_t>(w);
  for (int i = w * kWarp; i < std::min(g.n, (w + 1) * kWarp); ++i)
    if (((mask >> (i % kWarp)) & 1u) && g.fib[static_cast<size_t>(i)].st == St::done)
      throw std::runtime_error("emu: lane " + std::to_string(i % kWarp) + " of warp " + std::to_string(w) +
                               " has exited, but a warp shuffle or __syncwarp names it in its mask (undefined on a GPU)");
  g.warp_mask[wi] |= mask;
  f.st = St::wait_warp;
  ++g.warp_wait[static_cast<size_t>(w)];
  release_warp(w);
  if (f.st != St::runnable) yield_to_main();
}

const cudaDeviceProp& device_properties() {
  static const cudaDeviceProp p = [] {
    cudaDeviceProp d;
    std::memset(&d, 0, sizeof d);
    std::strcpy(d.name, "kiln host emulator");
    d.totalGlobalMem = kTotalMemory;
    d.multiProcessorCount = 4;
    d.sharedMemPerBlock = 48 * 1024;
    d.sharedMemPerBlockOptin = 227 * 1024;  // an H100's
    d.sharedMemPerMultiprocessor = 228 * 1024;
    d.maxThreadsPerBlock = 1024;
    d.maxThreadsPerMultiProcessor = 2048;
    d.maxThreadsDim[0] = d.maxThreadsDim[1] = 1024;
    d.maxThreadsDim[2] = 64;
    d.maxGridSize[0] = 0x7fffffff;
    d.maxGridSize[1] = d.maxGridSize[2] = 65535;
    d.regsPerBlock = 65536;
    d.warpSize = 32;
    d.major = 9;
    d.minor = 0;
    return d;
  }();
  return p;
}

cudaError_t func_set_attribute(const void* fn, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  if (value < 0 || static_cast<size_t>(value) > device_properties().sharedMemPerBlockOptin) return cudaErrorInvalidValue;
  std::lock_guard<std::mutex> lk(g_attr_mu);
  g_max_dynamic_smem[fn] = value;
  return cudaSuccess;
}

void run_grid(const char* name, const void* fn, const Config& c, void (*body)(void*), void* ctx) {
  if (g.cur != -1) throw std::runtime_error(std::string("emu: launch of ") + name + " from inside a kernel");
  const uint64_t threads = uint64_t{c.block.x} * c.block.y * c.block.z;
  const uint64_t blocks = uint64_t{c.grid.x} * c.grid.y * c.grid.z;
  // The limits of every GPU since sm_30 (a real launch fails with cudaErrorInvalidConfiguration).
  if (threads == 0 || threads > 1024 || c.block.z > 64 || blocks == 0 || c.grid.y > 65535 || c.grid.z > 65535 || c.grid.x > 2147483647u)
    throw std::runtime_error(std::string("emu: invalid launch configuration for ") + name + ": grid (" + std::to_string(c.grid.x) + ", " +
                             std::to_string(c.grid.y) + ", " + std::to_string(c.grid.z) + "), block (" + std::to_string(c.block.x) + ", " +
                             std::to_string(c.block.y) + ", " + std::to_string(c.block.z) + ")");
  // Dynamic shared memory: one buffer (blocks run one after another), up to an H100's 227 KiB per block.
  if (c.smem > device_properties().sharedMemPerBlockOptin)
    throw std::runtime_error(std::string("emu: ") + name + ": " + std::to_string(c.smem) +
                             " bytes of dynamic shared memory exceed 227 KiB");
  if (c.smem > device_properties().sharedMemPerBlock) {
    int allowed = 0;
    {
      std::lock_guard<std::mutex> lk(g_attr_mu);
      const auto it = g_max_dynamic_smem.find(fn);
      if (it != g_max_dynamic_smem.end()) allowed = it->second;
    }
    if (c.smem > static_cast<size_t>(allowed))
      throw std::runtime_error(std::string("emu: ") + name + ": launched with " + std::to_string(c.smem) +
                               " bytes of dynamic shared memory, above 48 KiB, but the kernel opted in to " + std::to_string(allowed) +
                               " (cudaFuncSetAttribute(MaxDynamicSharedMemorySize)); a GPU fails this launch");
  }
  g_smem_bytes = c.smem;
  if (g_smem.size() < c.smem) g_smem.assign(c.smem, 0);
  g.n = static_cast<int>(threads);
  while (g.fib.size() < static_cast<size_t>(g.n)) {
    g.fib.emplace_back();
    g.fib.back().mem = new_stack();
  }
  const int warps = (g.n + kWarp - 1) / kWarp;
  g.warp_live.assign(static_cast<size_t>(warps), 0);
  g.warp_wait.assign(static_cast<size_t>(warps), 0);
  g.warp_mask.assign(static_cast<size_t>(warps), 0);
  g.slots.assign(static_cast<size_t>(warps) * kWarp * kSlotBytes, 0);
  g.body = body;
  g.ctx = ctx;
  g.exc = nullptr;
  g_gridDim = c.grid;
  g_blockDim = c.block;
  ++g.stats.launches;
  if (std::strncmp(name, "vec_kernel", 10) == 0) ++g.stats.vec_launches;
  static const bool trace = [] {
    const char* e = std::getenv("KILN_EMU_TRACE");
    return e && *e && std::string(e) != "0";
  }();
  if (trace)  // KILN_EMU_TRACE=1: one line per launch on stderr
    std::fprintf(stderr, "emu launch %s grid (%u,%u,%u) block (%u,%u,%u)\n", name, c.grid.x, c.grid.y, c.grid.z, c.block.x, c.block.y,
                 c.block.z);
  const long page = sysconf(_SC_PAGESIZE);
  // The order of the blocks, and of the threads within each: grid order and alternating thread order,
  // or with a schedule seed a permutation of each drawn from (seed, launch number).
  std::vector<uint64_t> block_order;  // only for a shuffled schedule
  std::vector<int> thread_order(static_cast<size_t>(g.n));
  std::mt19937_64 shuffle(g_schedule * 0x9e3779b97f4a7c15ULL + g.stats.launches);
  if (g_schedule != 0) {
    block_order.resize(blocks);
    std::iota(block_order.begin(), block_order.end(), uint64_t{0});
    std::shuffle(block_order.begin(), block_order.end(), shuffle);
  }
  for (uint64_t nth = 0; nth < blocks; ++nth) {
    const uint64_t b = block_order.empty() ? nth : block_order[nth];
    const auto bx = static_cast<unsigned>(b % c.grid.x), by = static_cast<unsigned>(b / c.grid.x % c.grid.y),
               bz = static_cast<unsigned>(b / (uint64_t{c.grid.x} * c.grid.y));
    g_blockIdx = uint3{bx, by, bz};
    g.copies_late = ((bx + by + bz) & 1u) != 0;
    ++g_block_epoch;  // static shared arrays refill with garbage
    if (g_schedule != 0) {
      std::iota(thread_order.begin(), thread_order.end(), 0);
      std::shuffle(thread_order.begin(), thread_order.end(), shuffle);
    } else {
      const bool reverse = g_reverse || ((bx + by + bz + g.stats.launches) & 1) != 0;
      for (int k = 0; k < g.n; ++k) thread_order[static_cast<size_t>(k)] = reverse ? g.n - 1 - k : k;
    }
    std::fill(g_smem.begin(), g_smem.end(), static_cast<unsigned char>(0xff));  // garbage: NaN for floats
    ++g.stats.blocks;
    g.stats.threads += threads;
    for (int i = 0; i < g.n; ++i) start_fiber(i, c.block, page);
    g.live = g.n;
    g.block_wait = 0;
    std::fill(g.warp_wait.begin(), g.warp_wait.end(), 0);
    std::fill(g.warp_mask.begin(), g.warp_mask.end(), 0u);
    while (g.live > 0) {
      bool ran = false;
      for (const int i : thread_order) {
        Fiber& f = g.fib[static_cast<size_t>(i)];
        if (f.st != St::runnable) continue;
        g.cur = i;
        g_threadIdx = f.tid;
        resume(f);
        g.cur = -1;
        ran = true;
      }
      if (g.exc) break;
      if (!ran && g.live > 0) {
        int wb = 0, ww = 0;
        for (int i = 0; i < g.n; ++i) {
          wb += g.fib[static_cast<size_t>(i)].st == St::wait_block;
          ww += g.fib[static_cast<size_t>(i)].st == St::wait_warp;
        }
        g.cur = -1;
        throw std::runtime_error(std::string("emu: deadlock in kernel ") + name + " (block " + std::to_string(bx) + "," +
                                 std::to_string(by) + "," + std::to_string(bz) + "): " + std::to_string(g.live) + " live threads, " +
                                 std::to_string(wb) + " at __syncthreads, " + std::to_string(ww) + " at a warp barrier");
      }
    }
    if (g.exc) {
      g.cur = -1;
      std::rethrow_exception(g.exc);
    }
  }
}

}  // namespace emu
