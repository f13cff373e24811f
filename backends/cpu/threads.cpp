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

namespace kiln {
namespace {

std::atomic<int> g_threads{0};
std::once_flag g_once;

// A thread count from the variable `name`: 0 where it is unset or empty; `list`: OpenMP's form, whose
// first entry counts ("4,2": 4); where it is malformed, 0 for OMP_NUM_THREADS and a kiln::Error for
// kiln's own variable.
int env_threads(const char* name, bool list) {
  const char* v = std::getenv(name);
  if (!v || !*v) return 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  const bool ok = end != v && (*end == '\0' || (list && *end == ',')) && n > 0 && n < 4096;
  KILN_CHECK(ok || list, "{}='{}': expected a whole number of threads from 1 to 4095", name, v);
  return ok ? static_cast<int>(n) : 0;
}

void apply(int n) {
  g_threads.store(n, std::memory_order_relaxed);
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

void init() {
  int n = env_threads("KILN_NUM_THREADS", false);
  if (n == 0) n = env_threads("OMP_NUM_THREADS", true);
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
