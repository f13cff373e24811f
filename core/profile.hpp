#pragma once
// kiln::profile: where the time of a program goes, op by op (docs/profiling.md).
//
// Turned on by KILN_PROFILE=1 in the environment (the whole process; at exit the table goes to stderr
// and the Chrome trace to KILN_PROFILE_OUT, default kiln-profile.json; rank r of an mpirun/srun job
// writes <that path>.rank<r>), by `kiln train --profile out.json`, or in C++:
//
//   kiln::profile::start();
//   { kiln::profile::Scope s("my_block"); ... }         // a named region; ops inside nest under it
//   kiln::profile::stop();
//   std::cerr << kiln::profile::report();                 // the table, sorted by total time
//   kiln::profile::write_chrome_trace("trace.json");      // open in ui.perfetto.dev or chrome://tracing
//
// What is recorded: every backend op (each dispatch to the backend, forward and backward alike, named
// after the op: "matmul", "add", "rms_norm_forward", ...), each autograd node's backward
// ("matmul.backward", the ops it runs nest inside it), optimizer steps, data fetches and the steps of
// kiln::fit, on every thread that runs them (per-thread buffers, merged when read). On a device
// backend that registers a DeviceTimer (Cuda), each op is also timed by a pair of events on the
// backend's stream, read back when the report is made (no synchronisation per op).
//
// Off, an instrumented op costs one load of a global flag and a branch (plus the test of a local
// bool when the op returns): no clock read, no allocation, no formatting.
//
// Instrumenting a new op: put KILN_PROFILED (or KILN_PROFILED_FLOPS) in front of the backend call,
//   if (n) KILN_PROFILED("rms_norm_forward", y, x, w) B::rms_norm_forward(y.mview(), ...);
// It names the op (a string literal), lists its operands (Tensors, Views, MutViews or vectors of
// them: their shapes go into the trace, their sizes into the bytes moved), and times the statement
// that follows. The template parameter of the enclosing function must be called B (the backend).
#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/core/backend.hpp"
#include "kiln/core/dtype.hpp"
#include "kiln/core/shape.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::profile {

namespace detail {
extern std::atomic<bool> g_enabled;
}

// True while recording. The hot-path test: a relaxed load of one global flag.
inline bool enabled() noexcept { return detail::g_enabled.load(std::memory_order_relaxed); }

// Starts recording (a no-op when already recording). Events of earlier sessions are dropped.
void start();
// Stops recording; what was recorded stays readable until the next start() or clear().
void stop();
// Drops every recorded event. Call it when no other thread is recording.
void clear();

// Starts on construction, stops on destruction.
class Session {
 public:
  Session() { start(); }
  ~Session() { stop(); }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;
};

// One recorded event, as merged from every thread (times in ns since the session started).
struct Event {
  std::string name, cat;  // cat: "op", "backward", "optim", "data", "step" or "user"
  int tid = 0;            // the recording thread, numbered from 0 in the order threads first recorded
  int64_t ts_ns = 0, dur_ns = 0;
  int64_t self_ns = 0;                            // dur_ns minus the time of the events nested directly inside it
  int depth = 0;                                  // 0 = outermost on its thread
  double flops = 0;                               // the op's floating-point operations (0 where not defined)
  int64_t bytes = 0;                              // bytes of its operands (read + written), 0 for scopes
  std::string shapes;                             // e.g. "[8, 128, 256] x [256, 768] -> [8, 128, 768] f32"
  int64_t device_ts_ns = -1, device_dur_ns = -1;  // on the device's stream (Cuda), -1 when not timed there
};

// Every event recorded in the last session, each thread's events in order of start time.
std::vector<Event> events();

// One row of the table: the events of one name summed.
struct Stat {
  std::string name, cat;
  int64_t calls = 0;
  int64_t total_ns = 0, self_ns = 0, device_ns = -1;
  double flops = 0;
  int64_t bytes = 0;
};
// The rows, sorted by total time (device time where measured), longest first.
std::vector<Stat> stats();

// The table (stats() with GFLOP/s or GB/s and the top ops' shapes), at most `rows` rows.
std::string report(size_t rows = 40);
// The Chrome trace event format (JSON), for Perfetto (ui.perfetto.dev) and chrome://tracing. In one
// rank of a job (launcher_rank() >= 0) every event's "pid" is the rank, and the process is named
// "kiln rank <r>"; otherwise the pid is 1.
void write_chrome_trace(const std::string& path);
// The rank a launcher gave this process: under mpirun, srun or another PMI launcher (the variables
// dist::launched() looks for: OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK), its OMPI_COMM_WORLD_RANK,
// PMIX_RANK, PMI_RANK or SLURM_PROCID; -1 in a process started alone. (core/ reads the environment:
// it cannot ask kiln::dist, which sits above it.)
int launcher_rank();

// A named region on the calling thread. The const char* form keeps the pointer (give it a string
// literal or another string that outlives the session); the std::string form copies the name once
// into a table shared by all threads (a lock, taken only when recording).
class Scope {
 public:
  explicit Scope(const char* name, const char* cat = "user") noexcept {
    if (enabled()) [[unlikely]]
      open(name, cat);
  }
  explicit Scope(const std::string& name, const char* cat = "user");
  ~Scope() {
    if (open_) [[unlikely]]
      close();
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

 private:
  void open(const char* name, const char* cat) noexcept;
  void close() noexcept;
  bool open_ = false;
};

// A device backend's timer: events recorded on the backend's stream, resolved when read. record()
// returns an event handle; elapsed_ms(a, b) waits for b and gives the time between them (false if it
// cannot); release() frees a handle.
struct DeviceTimer {
  void* (*record)();
  bool (*elapsed_ms)(void* a, void* b, float* ms);
  void (*release)(void* e);
};
// Registers the timer used for ops of the backend named `backend` (Backend::name).
void register_device_timer(std::string_view backend, DeviceTimer timer);

namespace detail {

// What an op reads and writes: its layout (shape, and strides for the bytes actually touched), dtype
// and, for a list of tensors, how many.
struct Operand {
  const Layout* layout = nullptr;
  DType dtype = DType::f32;
  int64_t count = 1;
  int64_t bytes = 0;  // all of the list's bytes when count > 1
};
int64_t footprint_bytes(const Layout& l, DType d);

template <class S> Operand operand(const View<S>& v) { return {&v.layout, v.dtype, 1, footprint_bytes(v.layout, v.dtype)}; }
template <class S> Operand operand(const MutView<S>& v) { return {&v.layout, v.dtype, 1, footprint_bytes(v.layout, v.dtype)}; }
template <class T>
requires requires(const T& t) {
  t.layout();
  t.dtype();
  t.defined();
}
Operand operand(const T& t) {
  if (!t.defined()) return {};
  return {&t.layout(), t.dtype(), 1, footprint_bytes(t.layout(), t.dtype())};
}
template <class T> Operand operand(const std::vector<T>& xs) {
  Operand o;
  for (const T& x : xs) {
    const Operand e = operand(x);
    if (!o.layout)
      o = e;
    else
      o.bytes += e.bytes;
  }
  o.count = static_cast<int64_t>(xs.size());
  return o;
}
template <class T> Operand operand(const T* p) { return p ? operand(*p) : Operand{}; }

const DeviceTimer* device_timer(std::string_view backend) noexcept;
void begin_op(const char* name, double flops, const Operand* ops, int n, const DeviceTimer* dev) noexcept;
void end_op() noexcept;
// "<op>.backward", interned (the name of an autograd node's backward scope).
const char* backward_name(const char* op);

// The guard KILN_PROFILED puts around a backend call: `arm` (the deferred begin) runs only when
// recording, so that off the operand list and the FLOP count are not even evaluated.
class OpRange {
 public:
  template <class F> explicit OpRange(F&& arm) {
    if (enabled()) [[unlikely]] {
      arm(*this);
      open_ = true;
    }
  }
  ~OpRange() {
    if (open_) [[unlikely]]
      end_op();
  }
  OpRange(const OpRange&) = delete;
  OpRange& operator=(const OpRange&) = delete;
  template <class B, class... Ops> void begin(const char* name, double flops, const Ops&... ops) {
    const Operand list[] = {operand(ops)..., Operand{}};
    begin_op(name, flops, list, static_cast<int>(sizeof...(Ops)), device_timer(B::name));
  }

 private:
  bool open_ = false;
};

}  // namespace detail
}  // namespace kiln::profile

// Times the statement that follows as op `name` with the given operands (see the top of this file).
// The switch with an init-statement scopes the guard to exactly that statement, and cannot capture an
// `else` of the caller the way an `if` would.
#define KILN_PROFILED_FLOPS(name, flops, ...)                                                                              \
  switch (::kiln::profile::detail::OpRange kiln_profiled_{                                                                 \
      [&](::kiln::profile::detail::OpRange& r_) { r_.template begin<B>(name, static_cast<double>(flops), __VA_ARGS__); }}; \
          0)                                                                                                               \
  default:
#define KILN_PROFILED(name, ...) KILN_PROFILED_FLOPS(name, 0, __VA_ARGS__)
#pragma GCC visibility pop
