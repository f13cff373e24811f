// One thread pool for kiln's loops, OpenBLAS and oneDNN: the OpenMP runtime (libgomp). OpenBLAS is
// Debian's OpenMP build and oneDNN is built on OpenMP too, so all three share the same worker threads.
// The size is read once, at first use: KILN_NUM_THREADS, else OMP_NUM_THREADS, else every core.
#include <cblas.h>
#include <omp.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "kiln/backends/cpu/cpu.hpp"

namespace kiln {
namespace {

std::atomic<int> g_threads{0};
std::once_flag g_once;

int env_threads(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return (end && *end == '\0' && n > 0 && n < 4096) ? static_cast<int>(n) : 0;
}

void apply(int n) {
  g_threads.store(n, std::memory_order_relaxed);
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

void init() {
  int n = env_threads("KILN_NUM_THREADS");
  if (n == 0) n = env_threads("OMP_NUM_THREADS");
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
