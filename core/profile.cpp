// kiln::profile: per-thread event buffers, the table and the Chrome trace (core/profile.hpp).
//
// Each recording thread owns a log: a stack of open ranges and a chunked array of finished events.
// Only the owner writes; an event is published by a release store of the log's size, so readers
// (events(), report()) take a snapshot without a lock on the recording side. A session is a
// generation number: start() bumps it, and each thread empties its own log when it next records.
#include "kiln/core/profile.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "kiln/core/atomic_file.hpp"
#include "kiln/core/env.hpp"
#include "kiln/core/error.hpp"

namespace kiln::profile {

namespace detail {
std::atomic<bool> g_enabled{false};
}

namespace {

constexpr int kMaxOperands = 4;  // shapes kept per event (the rest still count in bytes)
constexpr int kMaxRank = 6;
constexpr int kMaxDepth = 64;
constexpr size_t kChunk = 4096;
constexpr size_t kMaxChunks = 4096;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Raw {
  const char* name = nullptr;
  const char* cat = nullptr;
  int64_t t0 = 0, dur = 0, self = 0;
  double flops = 0;
  int64_t bytes = 0;
  int16_t depth = 0;
  int8_t n_ops = 0;  // operands listed (may exceed kMaxOperands)
  std::array<int8_t, kMaxOperands> rank{};
  std::array<DType, kMaxOperands> dtype{};
  std::array<int32_t, kMaxOperands> count{};
  std::array<std::array<int64_t, kMaxRank>, kMaxOperands> dims{};
  void* dev0 = nullptr;  // device events (DeviceTimer handles), released once resolved
  void* dev1 = nullptr;
  const DeviceTimer* timer = nullptr;
  int64_t dev_ts = -1, dev_dur = -1;
};

struct Open {
  Raw raw;
  int64_t child = 0;  // time of the ranges nested directly inside
};

struct ThreadLog {
  int tid = 0;
  std::atomic<uint64_t> generation{0};  // the session its events belong to (written by the owner)
  std::array<std::atomic<Raw*>, kMaxChunks> chunks{};
  std::atomic<size_t> size{0};
  std::array<Open, kMaxDepth> open{};
  int depth = 0;  // open ranges (those beyond kMaxDepth are counted, not kept)
  std::atomic<int64_t> dropped{0};
  ~ThreadLog() {
    for (auto& c : chunks) delete[] c.load();
  }
};

struct Registry {
  std::mutex mu;
  std::vector<std::shared_ptr<ThreadLog>> logs;
  std::atomic<uint64_t> generation{1};
  int64_t session_start = 0, session_stop = 0;
  size_t max_events = 0;  // per thread
  std::unordered_set<std::string> names;
  std::vector<std::pair<std::string, DeviceTimer>> timers;
  std::atomic<int> n_timers{0};
  std::array<std::pair<std::string_view, const DeviceTimer*>, 8> timer_index{};
  // the session's first device event: device times are placed on the host timeline from it
  void* anchor = nullptr;
  const DeviceTimer* anchor_timer = nullptr;
  int64_t anchor_host = 0;
};

// Never destroyed: threads and the exit report may use it during static destruction.
Registry& registry() {
  static Registry* r = [] {
    const long long cap = static_cast<long long>(kChunk * kMaxChunks);
    const long long max_events =
        kiln::detail::env_whole("KILN_PROFILE_MAX_EVENTS", 0, std::numeric_limits<long long>::max(), "events per thread").value_or(500000);
    auto* x = new Registry;
    x->max_events = static_cast<size_t>(std::min(max_events, cap));
    return x;
  }();
  return *r;
}

thread_local std::shared_ptr<ThreadLog> t_log;

ThreadLog& log_of_thread() {
  Registry& r = registry();
  if (!t_log) [[unlikely]] {
    auto l = std::make_shared<ThreadLog>();
    std::lock_guard lock(r.mu);
    l->tid = static_cast<int>(r.logs.size());
    r.logs.push_back(l);
    t_log = std::move(l);
  }
  ThreadLog& l = *t_log;
  const uint64_t g = r.generation.load(std::memory_order_acquire);
  if (l.generation.load(std::memory_order_relaxed) != g) [[unlikely]] {  // a new session: this thread's old events go
    l.size.store(0, std::memory_order_release);
    l.dropped.store(0, std::memory_order_relaxed);
    l.generation.store(g, std::memory_order_release);
  }
  return l;
}

Raw* push_open(const char* name, const char* cat) noexcept {
  ThreadLog& l = log_of_thread();
  const int d = l.depth++;
  if (d >= kMaxDepth) return nullptr;
  Open& o = l.open[static_cast<size_t>(d)];
  o.child = 0;
  o.raw.name = name ? name : "(unnamed)";
  o.raw.cat = cat;
  o.raw.depth = static_cast<int16_t>(d);
  o.raw.flops = 0;
  o.raw.bytes = 0;
  o.raw.n_ops = 0;
  o.raw.dev0 = o.raw.dev1 = nullptr;
  o.raw.timer = nullptr;
  o.raw.dev_ts = o.raw.dev_dur = -1;
  o.raw.t0 = now_ns();
  return &o.raw;
}

void pop_close() noexcept {
  const int64_t t1 = now_ns();
  ThreadLog& l = *t_log;
  if (l.depth == 0) return;  // (cannot happen: every close has its open)
  const int d = --l.depth;
  if (d >= kMaxDepth) return;
  Open& o = l.open[static_cast<size_t>(d)];
  Raw& r = o.raw;
  if (r.timer && r.dev0) r.dev1 = r.timer->record();  // (no pair when the first record failed)
  r.dur = t1 - r.t0;
  r.self = r.dur - o.child;
  if (d > 0) l.open[static_cast<size_t>(d - 1)].child += r.dur;
  const size_t n = l.size.load(std::memory_order_relaxed);
  if (n >= registry().max_events) {
    l.dropped.fetch_add(1, std::memory_order_relaxed);
    if (r.timer) {
      r.timer->release(r.dev0);
      r.timer->release(r.dev1);
    }
    return;
  }
  std::atomic<Raw*>& chunk = l.chunks[n / kChunk];
  Raw* c = chunk.load(std::memory_order_relaxed);
  if (!c) {
    c = new (std::nothrow) Raw[kChunk];
    if (!c) {
      l.dropped.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    chunk.store(c, std::memory_order_release);
  }
  c[n % kChunk] = r;
  l.size.store(n + 1, std::memory_order_release);
}

const char* intern(const std::string& s) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  return r.names.insert(s).first->c_str();
}

std::string dims_str(const Raw& r, int i) {
  const auto u = static_cast<size_t>(i);
  std::string s = r.count[u] > 1 ? fmt::format("{} x ", r.count[u]) : "";
  if (r.rank[u] < 0) return s + "(undefined)";
  s += '[';
  const int rank = r.rank[u];
  for (int d = 0; d < std::min(rank, kMaxRank); ++d) s += fmt::format("{}{}", d ? ", " : "", r.dims[u][static_cast<size_t>(d)]);
  if (rank > kMaxRank) s += fmt::format(", ... ({} dims)", rank);
  return s + ']';
}

std::string shapes_str(const Raw& r) {
  if (r.n_ops == 0) return "";
  std::string s;
  const int n = std::min<int>(r.n_ops, kMaxOperands);
  for (int i = 0; i < n; ++i) s += (i ? ", " : "") + dims_str(r, i);
  if (r.n_ops > kMaxOperands) s += ", ...";
  return s + fmt::format(" {}", dtype_name(r.dtype[0]));
}

// A snapshot of the session's events with their device times resolved, each thread's by start time.
struct Snapshot {
  std::vector<std::pair<int, Raw>> events;  // (tid, event)
  int threads = 0;
  int64_t dropped = 0;
  int64_t start = 0;
};

void resolve_device(Registry& r, std::vector<std::pair<int, Raw*>>& pending) {
  // the anchor: the session's earliest device event (the stream runs in order); kept until the next session
  if (!r.anchor) {
    r.anchor = pending.front().second->dev0;
    r.anchor_timer = pending.front().second->timer;
    r.anchor_host = pending.front().second->t0;
  }
  for (auto& [tid, e] : pending) {
    float d = 0, off = 0;
    if (e->timer->elapsed_ms(e->dev0, e->dev1, &d) && e->timer->elapsed_ms(r.anchor, e->dev0, &off)) {
      e->dev_dur = static_cast<int64_t>(static_cast<double>(d) * 1e6);
      e->dev_ts = r.anchor_host + static_cast<int64_t>(static_cast<double>(off) * 1e6);
    }
    if (e->dev0 != r.anchor) e->timer->release(e->dev0);
    e->timer->release(e->dev1);
    e->dev0 = e->dev1 = nullptr;
    e->timer = nullptr;
  }
}

Snapshot snapshot() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  Snapshot s;
  s.start = r.session_start;
  const uint64_t g = r.generation.load();
  std::vector<std::pair<int, Raw*>> pending;
  for (const auto& l : r.logs) {
    if (l->generation.load(std::memory_order_acquire) != g) continue;
    const size_t n = l->size.load(std::memory_order_acquire);
    if (n == 0) continue;
    ++s.threads;
    s.dropped += l->dropped.load(std::memory_order_relaxed);
    for (size_t i = 0; i < n; ++i) {
      Raw* e = &l->chunks[i / kChunk].load(std::memory_order_acquire)[i % kChunk];
      if (e->t0 < r.session_start) continue;  // opened before this session
      if (e->timer && e->dev0 && e->dev1) pending.emplace_back(l->tid, e);
    }
  }
  std::sort(pending.begin(), pending.end(), [](const auto& a, const auto& b) { return a.second->t0 < b.second->t0; });
  if (!pending.empty()) resolve_device(r, pending);
  for (const auto& l : r.logs) {
    if (l->generation.load(std::memory_order_acquire) != g) continue;
    const size_t n = l->size.load(std::memory_order_acquire);
    for (size_t i = 0; i < n; ++i) {
      const Raw& e = l->chunks[i / kChunk].load(std::memory_order_acquire)[i % kChunk];
      if (e.t0 >= r.session_start) s.events.emplace_back(l->tid, e);
    }
  }
  // by thread, then start time, the enclosing event first
  std::sort(s.events.begin(), s.events.end(), [](const auto& a, const auto& b) {
    if (a.first != b.first) return a.first < b.first;
    if (a.second.t0 != b.second.t0) return a.second.t0 < b.second.t0;
    return a.second.depth < b.second.depth;
  });
  return s;
}

// The time an op is charged with: its device time where the device timed it.
int64_t charged_ns(const Stat& s) { return s.device_ns >= 0 ? s.device_ns : s.total_ns; }

std::string json_escape(std::string_view s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\')
      o += '\\', o += c;
    else if (static_cast<unsigned char>(c) < 0x20)
      o += fmt::format("\\u{:04x}", c);
    else
      o += c;
  }
  return o;
}

}  // namespace

int launcher_rank() {
  // Those dist::launched() looks for (a job's size, or PMIx's rank), then the rank beside them.
  const auto env = [](const char* n) -> const char* {
    const char* v = std::getenv(n);
    return v && *v ? v : nullptr;
  };
  if (!env("OMPI_COMM_WORLD_SIZE") && !env("PMI_SIZE") && !env("PMIX_RANK")) return -1;
  for (const char* n : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char* v = env(n)) {
      char* end = nullptr;
      const long r = std::strtol(v, &end, 10);
      if (end && *end == '\0' && r >= 0 && r <= INT32_MAX) return static_cast<int>(r);
    }
  return -1;
}

namespace {

// KILN_PROFILE=1: record the whole process, report at exit (unless the program stopped it itself).
// One rank of a job writes its own file: the path + ".rank<r>", as `kiln train --profile` does.
void exit_report() {
  if (!enabled()) return;
  stop();
  const char* out = std::getenv("KILN_PROFILE_OUT");
  std::string path = out && *out ? out : "kiln-profile.json";
  if (const int r = launcher_rank(); r >= 0) path += fmt::format(".rank{}", r);
  try {
    std::fputs(report().c_str(), stderr);
    write_chrome_trace(path);
    std::fprintf(stderr, "kiln profile: Chrome trace written to %s (open it in ui.perfetto.dev)\n", path.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kiln profile: %s\n", e.what());
  }
}

// (Before main: a malformed setting ends the process with its message, exit status 1.)
const bool g_env_started = [] {
  const char* e = std::getenv("KILN_PROFILE");
  if (!e || !*e || std::string_view(e) == "0") return false;
  try {
    start();
  } catch (const std::exception& x) {
    std::fprintf(stderr, "kiln profile: %s\n", x.what());
    std::exit(1);
  }
  std::atexit(exit_report);
  return true;
}();

}  // namespace

namespace detail {
// A device runtime registers its own teardown at exit when it initialises (the CUDA runtime does: after
// it, cudaEventSynchronize answers cudaErrorCudartUnloading), which is after this library's static
// start-up registered exit_report; exit handlers run last-registered first, so the report would find the
// device's events gone and drop every device time. Registering the report again once the first device
// event exists, i.e. after the runtime's initialisation, runs it before the teardown; the earlier
// registration then finds the profiler stopped and does nothing.
void rearm_exit_report_after_device_init() noexcept {
  static std::atomic<bool> done{false};
  // (a plain load first: this runs for every timed device op, the exchange only until it has happened)
  if (!g_env_started || done.load(std::memory_order_relaxed) || done.exchange(true)) return;
  std::atexit(exit_report);
}
}  // namespace detail

// ------------------------------------------------------------------------------------------ control
void start() {
  Registry& r = registry();
  if (enabled()) return;
  {
    std::lock_guard lock(r.mu);
    const uint64_t g = r.generation.load();
    for (const auto& l : r.logs) {  // device events never read: give them back
      if (l->generation.load(std::memory_order_acquire) != g) continue;
      const size_t n = l->size.load(std::memory_order_acquire);
      for (size_t i = 0; i < n; ++i) {
        Raw& e = l->chunks[i / kChunk].load(std::memory_order_acquire)[i % kChunk];
        if (e.timer && e.dev0 != r.anchor) e.timer->release(e.dev0);
        if (e.timer) e.timer->release(e.dev1);
        e.timer = nullptr;
      }
    }
    if (r.anchor) r.anchor_timer->release(r.anchor);
    r.anchor = nullptr;
    r.generation.fetch_add(1, std::memory_order_acq_rel);
    r.session_start = now_ns();
    r.session_stop = 0;
  }
  detail::g_enabled.store(true, std::memory_order_release);
}

void stop() {
  if (!enabled()) return;
  detail::g_enabled.store(false, std::memory_order_release);
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  r.session_stop = now_ns();
}

void clear() {
  const bool on = enabled();
  stop();
  start();  // a fresh generation: every log is empty
  if (!on) stop();
}

void register_device_timer(std::string_view backend, DeviceTimer timer) {
  KILN_CHECK(timer.record && timer.elapsed_ms && timer.release, "profile: device timer for '{}' lacks a function", backend);
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  const int n = r.n_timers.load();
  KILN_CHECK(n < static_cast<int>(r.timer_index.size()), "profile: too many device timers");
  r.timers.reserve(r.timer_index.size());  // (stable addresses: index entries point into it)
  r.timers.emplace_back(std::string(backend), timer);
  r.timer_index[static_cast<size_t>(n)] = {r.timers.back().first, &r.timers.back().second};
  r.n_timers.store(n + 1, std::memory_order_release);
}

// ------------------------------------------------------------------------------------------ recording
namespace detail {

int64_t footprint_bytes(const Layout& l, DType d) {
  int64_t n = 1;  // elements actually stored: broadcast (stride 0) dims are read once
  for (size_t i = 0; i < l.shape.size(); ++i)
    if (l.strides.size() != l.shape.size() || l.strides[i] != 0) n *= l.shape[i];
  return n * static_cast<int64_t>(dtype_size(d));
}

const DeviceTimer* device_timer(std::string_view backend) noexcept {
  Registry& r = registry();
  const int n = r.n_timers.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i)
    if (r.timer_index[static_cast<size_t>(i)].first == backend) return r.timer_index[static_cast<size_t>(i)].second;
  return nullptr;
}

void begin_op(const char* name, double flops, const Operand* ops, int n, const DeviceTimer* dev) noexcept {
  Raw* r = push_open(name, "op");
  if (!r) return;
  r->flops = flops;
  r->n_ops = static_cast<int8_t>(std::min(n, 127));
  for (int i = 0; i < n; ++i) {
    r->bytes += ops[i].bytes;
    if (i >= kMaxOperands) continue;
    const auto u = static_cast<size_t>(i);
    r->count[u] = static_cast<int32_t>(ops[i].count);
    r->dtype[u] = ops[i].dtype;
    if (!ops[i].layout) {
      r->rank[u] = -1;
      continue;
    }
    const Shape& s = ops[i].layout->shape;
    r->rank[u] = static_cast<int8_t>(std::min<size_t>(s.size(), 127));
    for (size_t d = 0; d < std::min<size_t>(s.size(), kMaxRank); ++d) r->dims[u][d] = s[d];
  }
  if (dev) {
    r->timer = dev;
    r->dev0 = dev->record();
    if (r->dev0) rearm_exit_report_after_device_init();
    r->t0 = now_ns();  // (not charging the host with the event record)
  }
}

void end_op() noexcept { pop_close(); }

const char* backward_name(const char* op) {
  thread_local std::unordered_map<const char*, const char*> cache;
  auto [it, fresh] = cache.try_emplace(op, nullptr);
  if (fresh) it->second = intern(std::string(op ? op : "node") + ".backward");
  return it->second;
}

}  // namespace detail

Scope::Scope(const std::string& name, const char* cat) {
  if (enabled()) open(intern(name), cat);
}
void Scope::open(const char* name, const char* cat) noexcept {
  push_open(name, cat);
  open_ = true;
}
void Scope::close() noexcept { pop_close(); }

// ------------------------------------------------------------------------------------------ reading
std::vector<Event> events() {
  const Snapshot s = snapshot();
  std::vector<Event> out;
  out.reserve(s.events.size());
  for (const auto& [tid, r] : s.events) {
    Event e;
    e.name = r.name;
    e.cat = r.cat;
    e.tid = tid;
    e.ts_ns = r.t0 - s.start;
    e.dur_ns = r.dur;
    e.self_ns = r.self;
    e.depth = r.depth;
    e.flops = r.flops;
    e.bytes = r.bytes;
    e.shapes = shapes_str(r);
    if (r.dev_dur >= 0) {
      e.device_ts_ns = r.dev_ts - s.start;
      e.device_dur_ns = r.dev_dur;
    }
    out.push_back(std::move(e));
  }
  return out;
}

namespace {
std::vector<Stat> aggregate(const Snapshot& s) {
  std::map<std::string_view, Stat> by;
  for (const auto& [tid, r] : s.events) {
    Stat& st = by[r.name];
    if (st.calls == 0) {
      st.name = r.name;
      st.cat = r.cat;
    }
    ++st.calls;
    st.total_ns += r.dur;
    st.self_ns += r.self;
    st.flops += r.flops;
    st.bytes += r.bytes;
    if (r.dev_dur >= 0) st.device_ns = std::max<int64_t>(st.device_ns, 0) + r.dev_dur;
  }
  std::vector<Stat> out;
  for (auto& [k, v] : by) out.push_back(std::move(v));
  std::stable_sort(out.begin(), out.end(), [](const Stat& a, const Stat& b) { return charged_ns(a) > charged_ns(b); });
  return out;
}
}  // namespace

std::vector<Stat> stats() { return aggregate(snapshot()); }

std::string report(size_t rows) {
  const Snapshot s = snapshot();
  const std::vector<Stat> st = aggregate(s);
  Registry& r = registry();
  int64_t wall;
  {
    std::lock_guard lock(r.mu);
    wall = (r.session_stop ? r.session_stop : now_ns()) - r.session_start;
  }
  int64_t self_sum = 0;
  bool device = false;
  for (const Stat& x : st) {
    self_sum += x.self_ns;
    device |= x.device_ns >= 0;
  }
  std::string o = fmt::format("kiln profile: {} events on {} thread{}, {:.1f} ms profiled{}\n", s.events.size(), s.threads,
                              s.threads == 1 ? "" : "s", static_cast<double>(wall) * 1e-6,
                              s.dropped ? fmt::format(" ({} events dropped: over KILN_PROFILE_MAX_EVENTS)", s.dropped) : "");
  o += fmt::format("{:<34} {:>8} {:>11} {:>11} {:>6}{} {:>13}\n", "name", "calls", "total ms", "self ms", "self%",
                   device ? fmt::format(" {:>11}", "device ms") : "", "rate");
  const size_t shown = std::min(rows, st.size());
  for (size_t i = 0; i < shown; ++i) {
    const Stat& x = st[i];
    const double secs = static_cast<double>(charged_ns(x)) * 1e-9;
    std::string rate;
    auto num = [](double v) { return v < 1e-3 ? std::string("<0.001") : fmt::format("{:.3g}", v); };
    if (x.flops > 0 && secs > 0)
      rate = num(x.flops / secs * 1e-9) + " GFLOP/s";
    else if (x.bytes > 0 && secs > 0)
      rate = num(static_cast<double>(x.bytes) / secs * 1e-9) + " GB/s";
    std::string name = x.name.size() > 34 ? x.name.substr(0, 31) + "..." : x.name;
    o += fmt::format(
        "{:<34} {:>8} {:>11.3f} {:>11.3f} {:>5.1f}%{} {:>13}\n", name, x.calls, static_cast<double>(x.total_ns) * 1e-6,
        static_cast<double>(x.self_ns) * 1e-6, self_sum ? 100.0 * static_cast<double>(x.self_ns) / static_cast<double>(self_sum) : 0.0,
        device ? (x.device_ns >= 0 ? fmt::format(" {:>11.3f}", static_cast<double>(x.device_ns) * 1e-6) : fmt::format(" {:>11}", "-")) : "",
        rate);
  }
  if (st.size() > shown) o += fmt::format("... {} more rows\n", st.size() - shown);

  // the most common shapes of the top ops
  std::map<std::string_view, std::map<std::string, std::pair<int64_t, int64_t>>> shapes;  // name -> shapes -> (calls, ns)
  for (const auto& [tid, e] : s.events) {
    if (e.n_ops == 0) continue;
    auto& [calls, ns] = shapes[e.name][shapes_str(e)];
    ++calls;
    ns += e.dev_dur >= 0 ? e.dev_dur : e.dur;
  }
  std::string sh;
  int listed = 0;
  for (size_t i = 0; i < st.size() && listed < 8; ++i) {
    auto it = shapes.find(st[i].name);
    if (it == shapes.end()) continue;
    ++listed;
    std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> v(it->second.begin(), it->second.end());
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second.second > b.second.second; });
    sh += fmt::format("  {}\n", st[i].name);
    for (size_t j = 0; j < std::min<size_t>(v.size(), 3); ++j)
      sh += fmt::format("    {:>6} x {:>9.3f} ms  {}\n", v[j].second.first, static_cast<double>(v[j].second.second) * 1e-6, v[j].first);
    if (v.size() > 3) sh += fmt::format("    ... {} more shapes\n", v.size() - 3);
  }
  if (!sh.empty()) o += "shapes of the top ops (operands as passed to the backend, outputs first; calls x time):\n" + sh;
  return o;
}

void write_chrome_trace(const std::string& path) {
  const Snapshot s = snapshot();
  std::string o = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  const int rank = launcher_rank();
  const int pid = rank >= 0 ? rank : 1;  // one process of a job: its rank (the ranks' traces side by side)
  constexpr int kDeviceTid = 1000000;    // the device stream's track
  bool first = true;
  auto sep = [&] {
    if (!first) o += ",\n";
    first = false;
  };
  std::vector<int> tids;
  bool device = false;
  for (const auto& te : s.events) {
    const auto& [tid, e] = te;
    if (tids.empty() || tids.back() != tid) tids.push_back(tid);
    auto args = [&e = te.second] {  // clang < 16 cannot capture a structured binding
      std::string a = "{";
      if (e.n_ops)
        a += fmt::format("\"shapes\": \"{}\", \"dtype\": \"{}\", \"bytes\": {}", json_escape(shapes_str(e)), dtype_name(e.dtype[0]),
                         e.bytes);
      if (e.flops > 0) a += fmt::format(", \"flops\": {:.0f}", e.flops);
      return a + "}";
    };
    sep();
    o += fmt::format(R"({{"name": "{}", "cat": "{}", "ph": "X", "ts": {:.3f}, "dur": {:.3f}, "pid": {}, "tid": {}, "args": {}}})",
                     json_escape(e.name), e.cat, static_cast<double>(e.t0 - s.start) * 1e-3, static_cast<double>(e.dur) * 1e-3, pid, tid,
                     args());
    if (e.dev_dur >= 0) {
      device = true;
      sep();
      o += fmt::format(R"({{"name": "{}", "cat": "device", "ph": "X", "ts": {:.3f}, "dur": {:.3f}, "pid": {}, "tid": {}, "args": {}}})",
                       json_escape(e.name), static_cast<double>(e.dev_ts - s.start) * 1e-3, static_cast<double>(e.dev_dur) * 1e-3, pid,
                       kDeviceTid, args());
    }
  }
  for (int tid : tids) {
    sep();
    o += fmt::format(R"({{"name": "thread_name", "ph": "M", "pid": {}, "tid": {}, "args": {{"name": "kiln thread {}"}}}})", pid, tid, tid);
  }
  if (device) {
    sep();
    o += fmt::format(R"j({{"name": "thread_name", "ph": "M", "pid": {}, "tid": {}, "args": {{"name": "device stream (event timing)"}}}})j",
                     pid, kDeviceTid);
  }
  sep();
  o += fmt::format(R"({{"name": "process_name", "ph": "M", "pid": {}, "args": {{"name": "{}"}}}})", pid,
                   rank >= 0 ? fmt::format("kiln rank {}", rank) : std::string("kiln"));
  o += "\n]}\n";
  try {  // as every file kiln writes: never half-written (docs/formats.md)
    write_atomically(path, {{o.data(), o.size()}});
  } catch (const Error& e) {
    fail("profile: writing the Chrome trace to '{}': {}", path, e.what());
  }
}

}  // namespace kiln::profile
