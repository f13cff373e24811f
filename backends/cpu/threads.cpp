// One thread pool for kiln's loops, OpenBLAS and oneDNN: the OpenMP runtime (libgomp). OpenBLAS is
// Debian's OpenMP build and oneDNN is built on OpenMP too, so all three share the same worker threads.
// The size is read once, at first use: KILN_NUM_THREADS (a whole number from 1 to 4095, else a
// kiln::Error at that use and every later one), else the first number of OMP_NUM_THREADS (a malformed
// one is ignored, as libgomp ignores it after its own warning), else every core.
#include <cblas.h>
#include <omp.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "kiln/backends/cpu/cpu.hpp"
#include "kiln/core/env.hpp"

namespace kiln {
namespace {

std::atomic<int> g_threads{0};
std::once_flag g_once;

// OMP_NUM_THREADS in OpenMP's forms, whose first entry counts ("4,2": 4); 0 where it is unset or
// malformed (libgomp has warned about it already).
int omp_env_threads() {
  const char* v = std::getenv("OMP_NUM_THREADS");
  if (!v || !*v) return 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return end != v && (*end == '\0' || *end == ',') && n > 0 && n < 4096 ? static_cast<int>(n) : 0;
}

void apply(int n) {
  g_threads.store(n, std::memory_order_relaxed);
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

void init() {
  int n = static_cast<int>(detail::env_whole("KILN_NUM_THREADS", 1, 4095, "threads").value_or(0));
  if (n == 0) n = omp_env_threads();
  if (n == 0) n = omp_get_num_procs();
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  apply(n > 0 ? n : 1);
}

}  // namespace

int num_threads() {
  const int n = g_threads.load(std::memory_order_relaxed);
  if (n > 0) return n;
  std::call_once(g_once, init);
  return g_threads.load(std::memory_order_relaxed);
}

void set_num_threads(int n) {
  std::call_once(g_once, init);
  apply(n > 0 ? n : 1);
}

}  // namespace kiln
