// The process group and its collectives (dist/process_group.hpp): MPI for host tensors, NCCL for Cuda
// ones (dist/cuda/nccl.cpp), the identity for a group of one.
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

#if defined(KILN_HAVE_MPI)
#include <mpi.h>
#endif

#include "kiln/backends/host_storage.hpp"
#include "kiln/dist/detail.hpp"

namespace kiln::dist {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
    case ReduceOp::min: return "min";
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

bool is_half(DType d) { return d == DType::bf16 || d == DType::f16; }
DType wire_dtype(DType d) { return is_half(d) ? DType::f32 : d; }

#if defined(KILN_HAVE_MPI)
void check_mpi(int rc, const char* op, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  fail("{}: {} failed on rank {} of {}: {}", op, call, st().rank, st().size, std::string(msg, static_cast<size_t>(len)));
}

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

// Arms the watchdog around one blocking MPI call.
struct Watched {
  explicit Watched(const char* what) {
    if (Watchdog* w = watchdog_slot()) w->arm(what);
  }
  ~Watched() {
    if (Watchdog* w = watchdog_slot()) w->disarm();
  }
  Watched(const Watched&) = delete;
  Watched& operator=(const Watched&) = delete;
};

MPI_Datatype mpi_reduce_type(DType d) {
  switch (d) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::boolean: return MPI_C_BOOL;
    default: fail("dist: no MPI reduction type for {}", d);
  }
}

MPI_Datatype mpi_bits_type(DType d) {  // bit-for-bit transfers (broadcast, all_gather)
  switch (dtype_size(d)) {
    case 1: return MPI_UINT8_T;
    case 2: return MPI_UINT16_T;
    case 4: return MPI_UINT32_T;
    default: return MPI_UINT64_T;
  }
}

MPI_Op mpi_op(ReduceOp op, DType d) {
  const bool b = d == DType::boolean;
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg: return b ? MPI_LOR : MPI_SUM;
    case ReduceOp::max: return b ? MPI_LOR : MPI_MAX;
    case ReduceOp::min: return b ? MPI_LAND : MPI_MIN;
  }
  return MPI_SUM;
}

constexpr int64_t kMaxCount = INT_MAX;

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

// ------------------------------------------------------------------------------------ agreement
// all_reduce_async is a kind of its own: MPI never matches a nonblocking collective with a blocking
// one, so a rank in all_reduce_async and another in all_reduce would wait for each other for ever.
enum class Kind : int64_t { all_reduce = 1, broadcast, all_gather, reduce_scatter, barrier, all_reduce_async };
const char* kind_name(int64_t k) {
  static const char* names[] = {"?", "all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier", "all_reduce_async"};
  return k >= 1 && k <= 6 ? names[k] : "?";
}
constexpr int kShapeSlots = 6;
constexpr int kSig = 6 + kShapeSlots;  // kind, dtype, numel, arg, bad, ndim, shape...

std::string describe(const int64_t* v) {
  const auto kind = v[0];
  std::string s = kind_name(kind);
  if (kind == static_cast<int64_t>(Kind::barrier)) return s;
  s += fmt::format(" {} [", static_cast<DType>(v[1]));
  const int64_t nd = v[5];
  for (int64_t i = 0; i < std::min<int64_t>(nd, kShapeSlots); ++i) s += fmt::format("{}{}", i ? ", " : "", v[6 + i]);
  if (nd > kShapeSlots) s += ", ...";
  s += fmt::format("] ({} elements)", v[2]);
  if (kind == static_cast<int64_t>(Kind::broadcast)) s += fmt::format(" root {}", v[3]);
  else if (kind == static_cast<int64_t>(Kind::all_reduce) || kind == static_cast<int64_t>(Kind::all_reduce_async) ||
           kind == static_cast<int64_t>(Kind::reduce_scatter))
    s += fmt::format(" {}", reduce_op_name(static_cast<ReduceOp>(v[3])));
  return s;
}

// Every rank passes what it was given; a difference, or a rank whose own checks failed, raises on
// every rank. Off (or a group of one): only this rank's own error.
void agree(const char* op, Kind kind, DType d, int64_t numel, int64_t arg, const Shape& shape, const std::string& local_error) {
  State& s = st();
#if defined(KILN_HAVE_MPI)
  if (s.check && s.size > 1) {
    int64_t v[kSig] = {};
    v[0] = static_cast<int64_t>(kind);
    v[1] = static_cast<int64_t>(d);
    v[2] = numel;
    v[3] = arg;
    v[4] = local_error.empty() ? 0 : 1;
    v[5] = static_cast<int64_t>(shape.size());
    for (size_t i = 0; i < shape.size() && i < kShapeSlots; ++i) v[6 + i] = shape[i];
    int64_t mm[2 * kSig];
    for (int i = 0; i < kSig; ++i) {
      mm[i] = v[i];
      mm[kSig + i] = -v[i];
    }
    {
      const Watched w(op);
      check_mpi(MPI_Allreduce(MPI_IN_PLACE, mm, 2 * kSig, MPI_INT64_T, MPI_MAX, s.comm), op, "MPI_Allreduce (consistency check)");
    }
    bool same = true;
    for (int i = 0; i < kSig; ++i) same = same && mm[i] == -mm[kSig + i];
    if (same && mm[4] == 0) return;
    std::vector<int64_t> all(static_cast<size_t>(kSig) * static_cast<size_t>(s.size));
    {
      const Watched w(op);
      check_mpi(MPI_Allgather(v, kSig, MPI_INT64_T, all.data(), kSig, MPI_INT64_T, s.comm), op, "MPI_Allgather (consistency check)");
    }
    if (!local_error.empty()) fail("{}", local_error);
    std::string bad, ranks;
    for (int r = 0; r < s.size; ++r) {
      const int64_t* w = all.data() + static_cast<size_t>(r) * kSig;
      if (w[4]) bad += fmt::format("{}{}", bad.empty() ? "" : ", ", r);
      ranks += fmt::format("{}rank {}: {}", r ? "; " : "", r, describe(w));
    }
    if (!bad.empty())
      fail("{}: rank {} failed its own checks (its message says why); no rank communicates. The ranks called: {}", op, bad, ranks);
    fail("{}: the ranks disagree: {}", op, ranks);
  }
#else
  (void)s, (void)kind, (void)d, (void)numel, (void)arg, (void)shape;
#endif
  if (!local_error.empty()) fail("{}", local_error);
}

template <Backend B> bool writable(const Tensor<B>& t) {
  const Layout& l = t.layout();
  for (size_t i = 0; i < l.shape.size(); ++i)
    if (l.strides[i] == 0 && l.shape[i] > 1) return false;
  return true;
}

template <Backend B> std::string tensor_error(const char* op, const char* what, const Tensor<B>& t, bool write) {
  if (!t.defined()) return fmt::format("{}: {} is an undefined tensor", op, what);
  if (write && !writable(t))
    return fmt::format("{}: {} (shape {}, strides {}) has overlapping elements (an expanded view) and cannot be written", op, what,
                       shape_str(t.shape()), shape_str(t.layout().strides));
  return "";
}

std::string op_error(const char* op, ReduceOp r, DType d) {
  if (r == ReduceOp::avg && !is_floating(d))
    return fmt::format("{}: avg needs a floating dtype, got {} (reduce with sum and divide)", op, d);
  return "";
}

template <Backend B> constexpr bool is_host = std::is_same_v<typename B::Storage, HostStorage>;
#if defined(KILN_HAVE_CUDA_BACKEND)
template <Backend B> constexpr bool is_cuda = std::is_same_v<B, Cuda>;
#else
template <Backend B> constexpr bool is_cuda = false;
#endif

template <Backend B> void* raw(const Tensor<B>& t) {
  return static_cast<char*>(t.storage()->data()) + t.layout().offset * static_cast<int64_t>(dtype_size(t.dtype()));
}
template <Backend B> int device_of([[maybe_unused]] const Tensor<B>& t) {
  if constexpr (is_cuda<B>) return t.storage()->device();
  else return -1;
}

// A contiguous tensor of dtype d with t's values: t itself when it already is one.
template <Backend B> Tensor<B> staged(const Tensor<B>& t, DType d) {
  if (t.dtype() == d && t.is_contiguous()) return t;
  return t.to(d).contiguous();
}
template <Backend B> bool same_memory(const Tensor<B>& a, const Tensor<B>& b) {
  return a.storage() == b.storage() && a.layout().offset == b.layout().offset && a.dtype() == b.dtype();
}

// After the wire op: avg's division and the copy back into `out` (in its dtype, rounding once).
template <Backend B> std::function<void()> finisher(Tensor<B> out, Tensor<B> buf, ReduceOp op, int n) {
  return [out, buf, op, n]() mutable {
    if (op == ReduceOp::avg && n > 1) buf.div_(Tensor<B>::full({}, n, buf.dtype()));
    if (!same_memory(out, buf)) out.copy_(buf.view(out.shape()));
  };
}

template <Backend B> std::vector<std::shared_ptr<const void>> keep_of(std::initializer_list<Tensor<B>> ts) {
  std::vector<std::shared_ptr<const void>> k;
  for (const auto& t : ts) k.push_back(t.storage());
  return k;
}

#if defined(KILN_HAVE_MPI)
// A started MPI operation: requests, then `finish` (on the host: the data is already in place).
struct MpiWork final : Work::Impl {
  std::vector<MPI_Request> reqs;
  std::function<void()> finish;
  std::vector<std::shared_ptr<const void>> keep;
  std::string what;
  bool failed = false;

  bool test() override {
    if (done) return true;
    int flag = 0;
    check_mpi(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE), what.c_str(), "MPI_Testall");
    if (flag) complete();
    return done;
  }
  void wait() override {
    if (done) return;
    const double limit = detail::timeout_s();
    if (limit <= 0) {
      check_mpi(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE), what.c_str(), "MPI_Waitall");
      complete();
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    while (!test()) {
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > limit) {
        failed = true;
        fail("{}: not complete after {} s on rank {} of {}: a peer is stuck or gone (the limit: InitOptions::timeout_s, KILN_DIST_TIMEOUT)",
             what, limit, st().rank, st().size);
      }
    }
  }
  void complete() {
    done = true;
    if (finish) finish();
    keep.clear();
  }
  ~MpiWork() override {
    if (done) return;
    if (failed) {  // MPI may still write into these buffers: never free them
      new std::vector<std::shared_ptr<const void>>(std::move(keep));
      return;
    }
    try {
      wait();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kiln::dist: %s\n", e.what());
    }
  }
};
#endif

struct DoneWork final : Work::Impl {
  DoneWork() { done = true; }
  bool test() override { return true; }
  void wait() override {}
};

// ------------------------------------------------------------------------------------ transports
// all_reduce of t (validated) on the wire; blocking completes it before returning.
template <Backend B> std::shared_ptr<Work::Impl> start_all_reduce(const Tensor<B>& t, ReduceOp op, const char* what, bool blocking) {
  State& s = st();
  const DType wire = wire_dtype(t.dtype());
  const Tensor<B> buf = staged(t, wire);
  auto finish = finisher(t, buf, op, s.size);
  const int64_t n = buf.numel();
  if constexpr (is_cuda<B>) {
    detail::NcclCall c{.coll = detail::NcclColl::all_reduce, .send = raw(buf), .recv = raw(buf), .count = n, .dtype = wire,
                       .op = op, .root = 0, .device = device_of(buf), .what = what};
    auto w = detail::nccl_start(c, std::move(finish), keep_of<B>({t, buf}));
    if (blocking) w->wait();
    return w;
  } else {
    static_assert(is_host<B>, "dist: a backend whose memory is neither host nor Cuda memory");
#if defined(KILN_HAVE_MPI)
    char* p = static_cast<char*>(raw(buf));
    const size_t es = dtype_size(wire);
    if (blocking) {
      const Watched wd(what);
      for (int64_t off = 0; off < n; off += kMaxCount)
        check_mpi(MPI_Allreduce(MPI_IN_PLACE, p + off * static_cast<int64_t>(es), static_cast<int>(std::min(kMaxCount, n - off)),
                                mpi_reduce_type(wire), mpi_op(op, wire), s.comm),
                  what, "MPI_Allreduce");
      finish();
      return std::make_shared<DoneWork>();
    }
    auto w = std::make_shared<MpiWork>();
    w->what = what;
    for (int64_t off = 0; off < n || (off == 0 && n == 0); off += kMaxCount) {
      MPI_Request r;
      check_mpi(MPI_Iallreduce(MPI_IN_PLACE, p + off * static_cast<int64_t>(es), static_cast<int>(std::min(kMaxCount, n - off)),
                               mpi_reduce_type(wire), mpi_op(op, wire), s.comm, &r),
                what, "MPI_Iallreduce");
      w->reqs.push_back(r);
      if (n == 0) break;
    }
    w->finish = std::move(finish);
    w->keep = keep_of<B>({t, buf});
    return w;
#else
    (void)blocking, (void)what, (void)n;
    fail("dist: no MPI in this build");
#endif
  }
}

template <Backend B> void run_broadcast(const Tensor<B>& t, int root) {
  State& s = st();
  const Tensor<B> buf = staged(t, t.dtype());
  const int64_t n = buf.numel();
  if constexpr (is_cuda<B>) {
    detail::NcclCall c{.coll = detail::NcclColl::broadcast, .send = raw(buf), .recv = raw(buf), .count = n, .dtype = t.dtype(),
                       .op = ReduceOp::sum, .root = root, .device = device_of(buf), .what = "broadcast"};
    detail::nccl_start(c, finisher(t, buf, ReduceOp::sum, s.size), keep_of<B>({t, buf}))->wait();
  } else {
#if defined(KILN_HAVE_MPI)
    char* p = static_cast<char*>(raw(buf));
    const auto es = static_cast<int64_t>(dtype_size(t.dtype()));
    const Watched wd("broadcast");
    for (int64_t off = 0; off < n; off += kMaxCount)
      check_mpi(MPI_Bcast(p + off * es, static_cast<int>(std::min(kMaxCount, n - off)), mpi_bits_type(t.dtype()), root, s.comm),
                "broadcast", "MPI_Bcast");
    finisher(t, buf, ReduceOp::sum, s.size)();
#else
    (void)s, (void)root, (void)n;
#endif
  }
}

template <Backend B> void run_all_gather(const Tensor<B>& out, const Tensor<B>& t) {
  State& s = st();
  const Tensor<B> send = staged(t, t.dtype());
  const Tensor<B> recv = staged(out, out.dtype());
  const int64_t n = send.numel();
  if constexpr (is_cuda<B>) {
    detail::NcclCall c{.coll = detail::NcclColl::all_gather, .send = raw(send), .recv = raw(recv), .count = n, .dtype = t.dtype(),
                       .op = ReduceOp::sum, .root = 0, .device = device_of(send), .what = "all_gather"};
    detail::nccl_start(c, finisher(out, recv, ReduceOp::sum, s.size), keep_of<B>({t, out, send, recv}))->wait();
  } else {
#if defined(KILN_HAVE_MPI)
    const MPI_Datatype ty = mpi_bits_type(t.dtype());
    const Watched wd("all_gather");
    check_mpi(MPI_Allgather(raw(send), static_cast<int>(n), ty, raw(recv), static_cast<int>(n), ty, s.comm), "all_gather", "MPI_Allgather");
    finisher(out, recv, ReduceOp::sum, s.size)();
#else
    (void)s, (void)n;
#endif
  }
}

template <Backend B> void run_reduce_scatter(const Tensor<B>& out, const Tensor<B>& t, ReduceOp op) {
  State& s = st();
  const DType wire = wire_dtype(t.dtype());
  const Tensor<B> send = staged(t, wire);
  const Tensor<B> recv = out.dtype() == wire && out.is_contiguous() ? out : Tensor<B>::empty({out.numel()}, wire);
  const int64_t k = out.numel();
  if constexpr (is_cuda<B>) {
    detail::NcclCall c{.coll = detail::NcclColl::reduce_scatter, .send = raw(send), .recv = raw(recv), .count = k, .dtype = wire,
                       .op = op, .root = 0, .device = device_of(send), .what = "reduce_scatter"};
    detail::nccl_start(c, finisher(out, recv, op, s.size), keep_of<B>({t, out, send, recv}))->wait();
  } else {
#if defined(KILN_HAVE_MPI)
    const Watched wd("reduce_scatter");
    check_mpi(MPI_Reduce_scatter_block(raw(send), raw(recv), static_cast<int>(k), mpi_reduce_type(wire), mpi_op(op, wire), s.comm),
              "reduce_scatter", "MPI_Reduce_scatter_block");
    finisher(out, recv, op, s.size)();
#else
    (void)s, (void)k, (void)op;
#endif
  }
}

std::string count_error(const char* op, int64_t n) {
  if (n > INT_MAX)
    return fmt::format("{}: {} elements per rank exceed one MPI call's count (2^31 - 1); split the tensor", op, n);
  return "";
}

}  // namespace

// ------------------------------------------------------------------------------------ the group
namespace detail {
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
  agree("barrier", Kind::barrier, DType::f32, 0, 0, {}, "");
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

// ------------------------------------------------------------------------------------ collectives
// The checks and the cross-rank agreement of all_reduce and all_reduce_async (`kind`).
template <Backend B> void agree_all_reduce(const char* what, Kind kind, const Tensor<B>& t, ReduceOp op) {
  detail::require_init(what);
  std::string err = tensor_error(what, "the tensor", t, true);
  if (err.empty()) err = op_error(what, op, t.dtype());
  agree(what, kind, t.defined() ? t.dtype() : DType::f32, t.defined() ? t.numel() : -1, static_cast<int64_t>(op),
        t.defined() ? t.shape() : Shape{}, err);
}

template <Backend B> void all_reduce(const Tensor<B>& t, ReduceOp op) {
  agree_all_reduce("all_reduce", Kind::all_reduce, t, op);
  if (st().size == 1) return;  // the sum (max, min, mean) over one rank
  start_all_reduce(t, op, "all_reduce", true);
}

template <Backend B> Work all_reduce_async(const Tensor<B>& t, ReduceOp op) {
  agree_all_reduce("all_reduce_async", Kind::all_reduce_async, t, op);  // blocking, at issue (process_group.hpp)
  if (st().size == 1) return Work();
  return Work(start_all_reduce(t, op, "all_reduce_async", false));
}

template <Backend B> void broadcast(const Tensor<B>& t, int root) {
  detail::require_init("broadcast");
  const int n = st().size;
  std::string err = tensor_error("broadcast", "the tensor", t, true);
  if (err.empty() && (root < 0 || root >= n)) err = fmt::format("broadcast: root {} is not a rank of this group of {} (0..{})", root, n, n - 1);
  agree("broadcast", Kind::broadcast, t.defined() ? t.dtype() : DType::f32, t.defined() ? t.numel() : -1, root,
        t.defined() ? t.shape() : Shape{}, err);
  if (n == 1) return;
  run_broadcast(t, root);
}

template <Backend B> void all_gather_into(const Tensor<B>& out, const Tensor<B>& t) {
  detail::require_init("all_gather");
  const int n = st().size;
  std::string err = tensor_error("all_gather", "the input", t, false);
  if (err.empty()) err = tensor_error("all_gather", "the output", out, true);
  if (err.empty() && (out.dtype() != t.dtype() || out.numel() != n * t.numel()))
    err = fmt::format("all_gather: the output is {} {} ({} elements); {} ranks of {} {} need {} {} elements", out.dtype(),
                      shape_str(out.shape()), out.numel(), n, t.dtype(), shape_str(t.shape()), n * t.numel(), t.dtype());
  if (err.empty()) err = count_error("all_gather", t.numel());
  agree("all_gather", Kind::all_gather, t.defined() ? t.dtype() : DType::f32, t.defined() ? t.numel() : -1, 0,
        t.defined() ? t.shape() : Shape{}, err);
  if (n == 1) {
    Tensor<B> o = out;  // a handle on the same elements
    o.copy_(t.reshape(out.shape()));
    return;
  }
  run_all_gather(out, t);
}

template <Backend B> Tensor<B> all_gather(const Tensor<B>& t) {
  detail::require_init("all_gather");
  Shape s{st().size};
  if (t.defined()) s.insert(s.end(), t.shape().begin(), t.shape().end());
  const Tensor<B> out = Tensor<B>::empty(s, t.defined() ? t.dtype() : DType::f32);
  all_gather_into(out, t);
  return out;
}

template <Backend B> void reduce_scatter_into(const Tensor<B>& out, const Tensor<B>& t, ReduceOp op) {
  detail::require_init("reduce_scatter");
  const int n = st().size;
  std::string err = tensor_error("reduce_scatter", "the input", t, false);
  if (err.empty()) err = tensor_error("reduce_scatter", "the output", out, true);
  if (err.empty()) err = op_error("reduce_scatter", op, t.dtype());
  if (err.empty() && (out.dtype() != t.dtype() || t.numel() != n * out.numel()))
    err = fmt::format("reduce_scatter: the input is {} {} ({} elements); {} ranks with an output of {} {} ({} elements) need {} {} elements",
                      t.dtype(), shape_str(t.shape()), t.numel(), n, out.dtype(), shape_str(out.shape()), out.numel(),
                      n * out.numel(), out.dtype());
  if (err.empty()) err = count_error("reduce_scatter", out.numel());
  agree("reduce_scatter", Kind::reduce_scatter, t.defined() ? t.dtype() : DType::f32, t.defined() ? t.numel() : -1,
        static_cast<int64_t>(op), t.defined() ? t.shape() : Shape{}, err);
  if (n == 1) {
    Tensor<B> o = out;
    o.copy_(t.reshape(out.shape()));
    return;
  }
  run_reduce_scatter(out, t, op);
}

template <Backend B> Tensor<B> reduce_scatter(const Tensor<B>& t, ReduceOp op) {
  detail::require_init("reduce_scatter");
  const int n = st().size;
  std::string err = tensor_error("reduce_scatter", "the input", t, false);
  if (err.empty() && (t.dim() < 1 || t.size(0) != n))
    err = fmt::format("reduce_scatter: the input's first axis must have one row per rank: shape {} for {} ranks (or use "
                      "reduce_scatter_into)",
                      shape_str(t.shape()), n);
  if (!err.empty()) {  // every rank learns of it
    agree("reduce_scatter", Kind::reduce_scatter, t.defined() ? t.dtype() : DType::f32, t.defined() ? t.numel() : -1,
          static_cast<int64_t>(op), t.defined() ? t.shape() : Shape{}, err);
  }
  const Shape s(t.shape().begin() + 1, t.shape().end());
  const Tensor<B> out = Tensor<B>::empty(s, t.dtype());
  reduce_scatter_into(out, t, op);
  return out;
}

double all_reduce_scalar(double x, ReduceOp op) {
  const Tensor<HostValues> t = Tensor<HostValues>::full({}, x, DType::f64);
  all_reduce(t, op);
  return item<double>(t);
}

void all_reduce_scalars(std::vector<double>& xs, ReduceOp op) {
  const Tensor<HostValues> t = Tensor<HostValues>::from_vector(xs, {static_cast<int64_t>(xs.size())});
  all_reduce(t, op);
  xs = t.to_vector<double>();
}

RowSlice batch_slice(int64_t batch_size, int rank, int world_size) {
  KILN_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "batch_slice: rank {} of a group of {}", rank, world_size);
  KILN_CHECK(batch_size >= 0 && batch_size % world_size == 0,
             "batch_slice: a global batch of {} rows does not divide among {} ranks (each rank takes an equal, contiguous slice "
             "of the rows): use a batch size that is a multiple of {}",
             batch_size, world_size, world_size);
  const int64_t per = batch_size / world_size;
  return {rank * per, per};
}
RowSlice batch_slice(int64_t batch_size) { return batch_slice(batch_size, rank(), world_size()); }

template <Backend B> Tensor<B> local_rows(const Tensor<B>& batch) {
  KILN_CHECK(batch.defined() && batch.dim() >= 1, "local_rows: the batch needs a first axis of rows, got {}",
             batch.defined() ? shape_str(batch.shape()) : std::string("an undefined tensor"));
  const RowSlice s = batch_slice(batch.size(0));
  return batch.narrow(0, s.start, s.count);
}

#define KILN_INST(B)                                                                        \
  template void all_reduce<B>(const Tensor<B>&, ReduceOp);                                  \
  template Work all_reduce_async<B>(const Tensor<B>&, ReduceOp);                            \
  template void broadcast<B>(const Tensor<B>&, int);                                        \
  template Tensor<B> all_gather<B>(const Tensor<B>&);                                       \
  template void all_gather_into<B>(const Tensor<B>&, const Tensor<B>&);                     \
  template Tensor<B> reduce_scatter<B>(const Tensor<B>&, ReduceOp);                         \
  template void reduce_scatter_into<B>(const Tensor<B>&, const Tensor<B>&, ReduceOp);       \
  template Tensor<B> local_rows<B>(const Tensor<B>&);
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::dist
