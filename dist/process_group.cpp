// The process group (dist/process_group.hpp): init and finalize, the group's ranks, the watchdog of the
// blocking MPI calls, the exit path, barrier and Work. The rest of kiln::dist: dist/collectives.cpp
// (the collectives for every backend), dist/consistency.cpp (the cross-rank check), the transports
// dist/mpi_transport.cpp (host memory) and dist/cuda/nccl.cpp (Cuda).
#include "kiln/dist/process_group.hpp"

#include <stdlib.h>  // on_exit (glibc)

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "kiln/dist/mpi.hpp"

namespace kiln::dist {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
  }
  return "?";
}

namespace {

struct State {
  bool initialized = false, finalized = false, owns_mpi = false;
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
  std::string processor;
  double timeout_s = 1800;
  bool check = true;
#if defined(KILN_HAVE_MPI)
  MPI_Comm comm = MPI_COMM_NULL;
#endif
  std::vector<std::function<void()>> shutdown;
};
State& st() {
  static State* s = new State;  // never destroyed: exit handlers still find it
  return *s;
}

double env_double(const char* name, double fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const double d = std::strtod(v, &end);
  KILN_CHECK(end && *end == '\0' && d >= 0, "dist::init: {}='{}' is not a number of seconds >= 0", name, v);
  return d;
}

#if !defined(KILN_HAVE_MPI)
int env_int(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : 0;
}
#endif

#if defined(KILN_HAVE_MPI)
// ------------------------------------------------------------------------------------ watchdog
// The blocking collectives run as MPI's own blocking calls (OpenMPI's tuned algorithms; its
// nonblocking twins take about twice as long on large buffers), which cannot be interrupted to raise
// an error. So a thread watches them: a call not complete after the group's time limit
// (InitOptions::timeout_s, KILN_DIST_TIMEOUT) means a peer stuck or gone without dying, and the
// watchdog names the op and the rank and ends the job (MPI_Abort), as PyTorch's NCCL watchdog does.
// Arming costs a clock read and two atomic writes; the thread wakes every quarter of the limit
// (0.05 to 5 s). Work::wait (the asynchronous ops) raises a kiln::Error under the same limit instead.
class Watchdog {
 public:
  void start(double limit_s) {
    limit_ns_ = static_cast<int64_t>(limit_s * 1e9);
    thread_ = std::thread([this, period = std::clamp(limit_s / 4, 0.05, 5.0)] { run(period); });
  }
  // Ends the thread and waits for it; true: the caller may delete the watchdog.
  bool stop() {
    {
      std::lock_guard<std::mutex> lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();  // an exit handler run by the watchdog's own MPI_Abort: the process ends
      return false;
    }
    if (thread_.joinable()) thread_.join();
    return true;
  }
  void arm(const char* what) {
    what_.store(what, std::memory_order_relaxed);
    since_ns_.store(now_ns(), std::memory_order_relaxed);
    seq_.fetch_add(1, std::memory_order_release);  // odd: a call in flight
  }
  void disarm() { seq_.fetch_add(1, std::memory_order_release); }

 private:
  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  void run(double period) {
    std::unique_lock<std::mutex> lk(m_);
    while (!cv_.wait_for(lk, std::chrono::duration<double>(period), [this] { return stop_; })) {
      const uint64_t seq = seq_.load(std::memory_order_acquire);
      if (seq % 2 == 0 || now_ns() - since_ns_.load(std::memory_order_relaxed) <= limit_ns_ || seq_.load() != seq) continue;
      std::fflush(stdout);
      std::fprintf(stderr,
                   "kiln::dist: %s: not complete after %g s on rank %d of %d: a peer is stuck or gone (the limit: InitOptions::timeout_s, "
                   "KILN_DIST_TIMEOUT); ending the job (MPI_Abort)\n",
                   what_.load(), static_cast<double>(limit_ns_) / 1e9, st().rank, st().size);
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
      std::_Exit(1);
    }
  }
  std::atomic<uint64_t> seq_{0};
  std::atomic<int64_t> since_ns_{0};
  std::atomic<const char*> what_{""};
  int64_t limit_ns_ = 0;
  std::mutex m_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};
Watchdog*& watchdog_slot() {
  static Watchdog* w = nullptr;  // set by init() when the group has peers and a limit; deleted by finalize()
  return w;
}

// The exit path: a rank that exits with a non-zero status (an error, a caught exception turned into
// `return 1`) must not leave the others blocked in a collective, nor block itself in MPI_Finalize's
// fence: it aborts the job, which mpirun reports naming this rank. A zero status finalises.
void on_process_exit(int status, void*) {
  State& s = st();
  if (!s.initialized || s.finalized) return;
  if (status != 0 && s.size > 1) {
    std::fflush(stdout);
    std::fprintf(stderr, "kiln::dist: rank %d of %d exits with status %d: ending the job (MPI_Abort)\n", s.rank, s.size, status);
    std::fflush(stderr);
    MPI_Abort(s.comm, status);
  }
  try {
    finalize();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln::dist: finalize at exit: %s\n", e.what());
  }
}
#endif

}  // namespace

// ------------------------------------------------------------------------------------ the group
namespace detail {
#if defined(KILN_HAVE_MPI)
MPI_Comm comm() { return st().comm; }

void check_mpi(int rc, const char* op, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  fail("{}: {} failed on rank {} of {}: {}", op, call, st().rank, st().size, std::string(msg, static_cast<size_t>(len)));
}

Watched::Watched(const char* what) {
  if (Watchdog* w = watchdog_slot()) w->arm(what);
}
Watched::~Watched() {
  if (Watchdog* w = watchdog_slot()) w->disarm();
}

MPI_Datatype mpi_reduce_type(DType d) {
  switch (d) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::f64:
      return MPI_DOUBLE;
    case DType::i32:
      return MPI_INT32_T;
    case DType::i64:
      return MPI_INT64_T;
    case DType::boolean:
      return MPI_C_BOOL;
    default:
      fail("dist: no MPI reduction type for {}", d);
  }
}

MPI_Datatype mpi_bits_type(DType d) {  // bit-for-bit transfers (broadcast, all_gather)
  switch (dtype_size(d)) {
    case 1:
      return MPI_UINT8_T;
    case 2:
      return MPI_UINT16_T;
    case 4:
      return MPI_UINT32_T;
    default:
      return MPI_UINT64_T;
  }
}

MPI_Op mpi_op(ReduceOp op, DType d) {
  const bool b = d == DType::boolean;
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return b ? MPI_LOR : MPI_SUM;
    case ReduceOp::max:
      return b ? MPI_LOR : MPI_MAX;
    case ReduceOp::min:
      return b ? MPI_LAND : MPI_MIN;
  }
  return MPI_SUM;
}

#endif

void require_init(const char* op) {
  const State& s = st();
  KILN_CHECK(!s.finalized, "{}: the process group was finalised (kiln::dist::finalize())", op);
  KILN_CHECK(s.initialized, "{}: the process group is not initialised: call kiln::dist::init() first", op);
}
int group_rank() { return st().rank; }
int group_size() { return st().size; }
double timeout_s() { return st().timeout_s; }
void broadcast_bytes(void* data, size_t n, int root, const char* op) {
  require_init(op);
#if defined(KILN_HAVE_MPI)
  if (st().size > 1) {
    const Watched wd(op);
    check_mpi(MPI_Bcast(data, static_cast<int>(n), MPI_BYTE, root, st().comm), op, "MPI_Bcast");
  }
#else
  (void)data, (void)n, (void)root;
#endif
}
void at_shutdown(std::function<void()> fn) { st().shutdown.push_back(std::move(fn)); }
}  // namespace detail

#if defined(KILN_HAVE_MPI)
using detail::check_mpi;
using detail::Watched;
#endif

void init(const InitOptions& o) {
  State& s = st();
  if (s.initialized) return;
  KILN_CHECK(!s.finalized, "dist::init: the process group was finalised and cannot start again in this process");
  KILN_CHECK(o.timeout_s >= 0, "dist::init: timeout_s must be >= 0, got {}", o.timeout_s);
  s.timeout_s = env_double("KILN_DIST_TIMEOUT", o.timeout_s);
  s.check = o.consistency_check;
  if (const char* c = std::getenv("KILN_DIST_CHECK"); c && *c) {
    KILN_CHECK(std::strcmp(c, "0") == 0 || std::strcmp(c, "1") == 0, "dist::init: KILN_DIST_CHECK='{}': use 0 or 1", c);
    s.check = c[0] == '1';
  }
#if defined(KILN_HAVE_MPI)
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    int provided = 0;
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "dist::init", "MPI_Init_thread");
    s.owns_mpi = true;
    KILN_CHECK(provided >= MPI_THREAD_SERIALIZED, "dist::init: this MPI provides thread level {}, kiln needs MPI_THREAD_SERIALIZED ({})",
               provided, static_cast<int>(MPI_THREAD_SERIALIZED));
  }
  check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &s.comm), "dist::init", "MPI_Comm_dup");
  check_mpi(MPI_Comm_set_errhandler(s.comm, MPI_ERRORS_RETURN), "dist::init", "MPI_Comm_set_errhandler");
  MPI_Comm_rank(s.comm, &s.rank);
  MPI_Comm_size(s.comm, &s.size);
  MPI_Comm node;
  check_mpi(MPI_Comm_split_type(s.comm, MPI_COMM_TYPE_SHARED, s.rank, MPI_INFO_NULL, &node), "dist::init", "MPI_Comm_split_type");
  MPI_Comm_rank(node, &s.local_rank);
  MPI_Comm_size(node, &s.local_size);
  MPI_Comm_free(&node);
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(name, &len);
  s.processor.assign(name, static_cast<size_t>(len));
  if (s.owns_mpi) on_exit(on_process_exit, nullptr);
  if (s.size > 1 && s.timeout_s > 0) {
    watchdog_slot() = new Watchdog;
    watchdog_slot()->start(s.timeout_s);
  }
#else
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const int n = env_int(v);
    KILN_CHECK(n <= 1,
               "dist::init: this process is one of {} ranks ({}={}), but this kiln was built without MPI (KILN_WITH_MPI=OFF "
               "or libopenmpi-dev missing): each rank would train alone. Rebuild kiln with MPI",
               n, v, n);
  }
#endif
  s.initialized = true;
}

void finalize() {
  State& s = st();
  if (!s.initialized || s.finalized) return;
  s.finalized = true;
  auto hooks = std::move(s.shutdown);
  for (auto& h : hooks) h();
#if defined(KILN_HAVE_MPI)
  if (Watchdog* w = watchdog_slot()) {
    watchdog_slot() = nullptr;
    if (w->stop()) delete w;  // its thread joined: nothing reads it any more
  }
  if (s.comm != MPI_COMM_NULL) MPI_Comm_free(&s.comm);
  int done = 0;
  MPI_Finalized(&done);
  if (s.owns_mpi && !done) MPI_Finalize();
#endif
}

bool is_initialized() { return st().initialized && !st().finalized; }
bool launched() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (const char* e = std::getenv(v); e && *e) return true;
  return false;
}
bool built_with_mpi() {
#if defined(KILN_HAVE_MPI)
  return true;
#else
  return false;
#endif
}
int rank() {
  detail::require_init("dist::rank");
  return st().rank;
}
int world_size() {
  detail::require_init("dist::world_size");
  return st().size;
}
int local_rank() {
  detail::require_init("dist::local_rank");
  return st().local_rank;
}
int local_world_size() {
  detail::require_init("dist::local_world_size");
  return st().local_size;
}
bool is_main_process() { return rank() == 0; }
std::string processor_name() {
  detail::require_init("dist::processor_name");
  return st().processor;
}
void set_consistency_check(bool on) { st().check = on; }
bool consistency_check() { return st().check; }

void barrier() {
  detail::require_init("barrier");
  detail::agree("barrier", detail::Kind::barrier, DType::f32, 0, 0, {}, "");
#if defined(KILN_HAVE_MPI)
  if (st().size > 1) {
    const Watched wd("barrier");
    check_mpi(MPI_Barrier(st().comm), "barrier", "MPI_Barrier");
  }
#endif
}

bool Work::test() { return !impl_ || impl_->done || impl_->test(); }
void Work::wait() {
  if (impl_ && !impl_->done) impl_->wait();
}
bool Work::completed() const { return !impl_ || impl_->done; }

}  // namespace kiln::dist
