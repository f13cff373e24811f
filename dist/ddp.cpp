// DistributedDataParallel (dist/ddp.hpp): buckets, the backward hooks, the end-of-pass round.
#include "kiln/dist/ddp.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "kiln/backends/backends.hpp"
#include "kiln/dist/detail.hpp"

namespace kiln::dist {

namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Every rank must hold the same parameters and buffers: compare a hash, then name the difference.
template <Backend B> void check_same_model(const std::vector<std::string>& lines) {
  std::string desc;
  for (const auto& l : lines) desc += l + "\n";
  const auto h = static_cast<int64_t>(fnv1a(desc) >> 1);
  const auto len = static_cast<int64_t>(desc.size());
  const Tensor<HostValues> mm = Tensor<HostValues>::from_vector(std::vector<int64_t>{h, -h, len, -len});
  all_reduce(mm, ReduceOp::max);
  const auto v = to_vector<int64_t>(mm);
  if (v[0] == -v[1] && v[2] == -v[3]) return;
  // Rank 0's description to everyone; each rank names its first difference.
  int64_t n0 = len;
  detail::broadcast_bytes(&n0, sizeof n0, 0, "DistributedDataParallel");
  std::string d0(static_cast<size_t>(n0), '\0');
  if (rank() == 0) d0 = desc;
  detail::broadcast_bytes(d0.data(), d0.size(), 0, "DistributedDataParallel");
  std::vector<std::string> l0;
  for (size_t a = 0, b; a < d0.size(); a = b + 1) {
    b = d0.find('\n', a);
    l0.push_back(d0.substr(a, b - a));
  }
  for (size_t i = 0; i < std::max(l0.size(), lines.size()); ++i) {
    const std::string a = i < l0.size() ? l0[i] : "(nothing)", b = i < lines.size() ? lines[i] : "(nothing)";
    if (a != b)
      fail("DistributedDataParallel: rank {}'s model differs from rank 0's at entry {}: rank 0 has {}, rank {} has {}", rank(), i, a,
           rank(), b);
  }
  fail("DistributedDataParallel: the ranks' models differ (this rank, {}, has rank 0's; the ranks that differ name the difference)",
       rank());
}

}  // namespace

template <Backend B> struct DistributedDataParallel<B>::Impl {
  struct Param {
    std::string name;
    Var<B> var;
    size_t bucket = 0;
    int64_t offset = 0, numel = 0, slot = 0;  // slot: index within its bucket (its flag)
    int64_t hook = 0;
  };
  struct BucketState {
    DType dtype = DType::f32;
    int64_t numel = 0;
    std::vector<size_t> params;
    Tensor<B> buf;  // [numel gradients | one flag per parameter]
    int64_t pending = 0;
    std::vector<uint8_t> used;
    Work work;
    bool launched = false;
  };

  nn::Module<B>& module;
  DDPOptions o;
  std::vector<Param> params;
  std::vector<BucketState> buckets;
  std::vector<uint8_t> ready;
  bool sync = true, round_active = false, all_used = true;
  uint64_t round_pass = ~uint64_t{0};  // the backward pass (autograd::backward_pass_count) of the last round
  size_t next_launch = 0;
  Stats stats;
  std::chrono::steady_clock::time_point t_end{};

  Impl(nn::Module<B>& m, DDPOptions opts) : module(m), o(opts) {}

  void start_round() {
    round_active = true;
    all_used = true;
    ready.assign(params.size(), 0);
    for (auto& b : buckets) {
      b.pending = static_cast<int64_t>(b.params.size());
      b.launched = false;
      std::fill(b.used.begin(), b.used.end(), 0);
    }
    next_launch = 0;
    if (autograd::in_backward()) autograd::queue_backward_callback([this] { finish_round(); });
  }

  void put(size_t i, const Tensor<B>& g) {
    Param& p = params[i];
    BucketState& b = buckets[p.bucket];
    Tensor<B> slot = b.buf.narrow(0, p.offset, p.numel);
    if (g.defined()) {
      const Tensor<B> flat = g.reshape({p.numel});
      if (!(flat.storage() == slot.storage() && flat.layout().offset == slot.layout().offset)) slot.copy_(flat);
      b.used[static_cast<size_t>(p.slot)] = 1;
    } else {
      slot.zero_();
      all_used = false;
    }
    ready[i] = 1;
    --b.pending;
  }

  void launch_ready(bool early) {
    while (next_launch < buckets.size() && buckets[next_launch].pending == 0) {
      BucketState& b = buckets[next_launch++];
      std::vector<float> flags(b.used.begin(), b.used.end());
      b.buf.narrow(0, b.numel, static_cast<int64_t>(flags.size())).copy_(Tensor<B>::from_vector(flags));
      b.work = all_reduce_async(b.buf, ReduceOp::avg);
      b.launched = true;
      ++stats.launched;
      if (early) ++stats.launched_early;
    }
  }

  void progress() {  // MPI moves non-blocking collectives only inside MPI calls
    for (size_t k = 0; k < next_launch; ++k)
      if (!buckets[k].work.completed()) {
        buckets[k].work.test();
        return;
      }
  }

  void on_grad(size_t i, const Tensor<B>& g) {
    if (!sync) return;
    if (!round_active) start_round();
    if (ready[i]) return;  // (cannot happen: a pass finalises a leaf once)
    put(i, g);
    launch_ready(true);
    progress();
  }

  void finish_round() {
    if (!round_active) return;
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < params.size(); ++i)
      if (!ready[i]) put(i, params[i].var.grad());  // accumulated under no_sync, or nothing: zeros
    launch_ready(false);
    for (auto& b : buckets) b.work.wait();
    const double w = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stats.wait_s += w;
    stats.last_wait_s = w;
    ++stats.rounds;
    for (auto& b : buckets) {
      std::vector<float> flags;
      if (!all_used) flags = to_vector<float>(b.buf.narrow(0, b.numel, static_cast<int64_t>(b.params.size())));
      for (size_t j = 0; j < b.params.size(); ++j) {
        Param& p = params[b.params[j]];
        if (all_used || flags[j] > 0)
          p.var.set_grad(b.buf.narrow(0, p.offset, p.numel).view(p.var.shape()));
        else
          p.var.set_grad(Tensor<B>());  // no rank gave it a gradient
      }
    }
    round_active = false;
    round_pass = autograd::backward_pass_count();
    if (o.broadcast_buffers) broadcast_buffers();
  }

  // Rank 0's buffers (BatchNorm's running statistics) to every rank, one broadcast per dtype: what
  // PyTorch's DDP broadcasts before the next forward in training, sent at the end of the round.
  void broadcast_buffers() {
    const auto bufs = module.named_buffers();
    std::vector<bool> done(bufs.size(), false);
    for (size_t i = 0; i < bufs.size(); ++i) {
      if (done[i]) continue;
      const DType d = bufs[i].second.dtype();
      std::vector<size_t> group;
      int64_t n = 0;
      for (size_t j = i; j < bufs.size(); ++j)
        if (!done[j] && bufs[j].second.dtype() == d) {
          group.push_back(j);
          done[j] = true;
          n += bufs[j].second.numel();
        }
      const Tensor<B> flat = Tensor<B>::empty({n}, d);
      int64_t off = 0;
      for (size_t j : group) {
        const Tensor<B>& t = bufs[j].second;
        if (rank() == 0) flat.narrow(0, off, t.numel()).copy_(t.reshape({t.numel()}));
        off += t.numel();
      }
      broadcast(flat, 0);
      if (rank() == 0) continue;
      off = 0;
      for (size_t j : group) {
        Tensor<B> t = bufs[j].second;  // a handle on the module's buffer
        t.copy_(flat.narrow(0, off, t.numel()).view(t.shape()));
        off += t.numel();
      }
    }
  }
};

template <Backend B> DistributedDataParallel<B>::DistributedDataParallel(nn::Module<B>& module, DDPOptions o) {
  detail::require_init("DistributedDataParallel");
  KILN_CHECK(o.bucket_mb > 0 && o.first_bucket_mb > 0, "DistributedDataParallel: bucket sizes must be > 0 MiB, got {} and {}", o.bucket_mb,
             o.first_bucket_mb);
  impl_ = std::make_unique<Impl>(module, o);
  Impl& m = *impl_;
  std::vector<std::string> lines;
  for (const auto& [name, v] : module.named_parameters()) {
    lines.push_back(fmt::format("parameter '{}' {} {}{}", name, v.dtype(), shape_str(v.shape()), v.requires_grad() ? "" : " (frozen)"));
    if (v.requires_grad()) m.params.push_back({.name = name, .var = v});
  }
  const auto buffers = module.named_buffers();
  for (const auto& [name, t] : buffers) lines.push_back(fmt::format("buffer '{}' {} {}", name, t.dtype(), shape_str(t.shape())));
  check_same_model<B>(lines);
  for (const auto& [name, v] : module.named_parameters()) broadcast(v.value(), 0);
  if (o.broadcast_buffers) m.broadcast_buffers();

  // Buckets: reverse registration order, one dtype each, first_bucket_mb then bucket_mb.
  const double mib = 1024.0 * 1024.0;
  for (size_t k = m.params.size(); k-- > 0;) {
    auto& p = m.params[k];
    p.numel = p.var.numel();
    const auto bytes = static_cast<double>(p.numel) * static_cast<double>(dtype_size(p.var.dtype()));
    const double cap = (m.buckets.size() <= 1 ? o.first_bucket_mb : o.bucket_mb) * mib;
    const bool fresh = m.buckets.empty() || m.buckets.back().dtype != p.var.dtype() ||
                       (!m.buckets.back().params.empty() &&
                        static_cast<double>(m.buckets.back().numel) * static_cast<double>(dtype_size(p.var.dtype())) + bytes > cap);
    if (fresh) {
      m.buckets.emplace_back();
      m.buckets.back().dtype = p.var.dtype();
    }
    auto& b = m.buckets.back();
    p.bucket = m.buckets.size() - 1;
    p.offset = b.numel;
    p.slot = static_cast<int64_t>(b.params.size());
    b.numel += p.numel;
    b.params.push_back(k);
  }
  for (auto& b : m.buckets) {
    b.buf = Tensor<B>::zeros({b.numel + static_cast<int64_t>(b.params.size())}, b.dtype);
    b.used.assign(b.params.size(), 0);
  }
  m.ready.assign(m.params.size(), 0);
  Impl* self = impl_.get();
  for (size_t i = 0; i < m.params.size(); ++i)
    m.params[i].hook = m.params[i].var.register_post_accumulate_hook([self, i](const Tensor<B>& g) { self->on_grad(i, g); });
}

template <Backend B> DistributedDataParallel<B>::~DistributedDataParallel() {
  if (!impl_) return;
  for (auto& p : impl_->params) p.var.remove_post_accumulate_hook(p.hook);
  for (auto& b : impl_->buckets) {  // MPI may still be writing into the buffers
    try {
      b.work.wait();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kiln::dist: ~DistributedDataParallel: %s\n", e.what());
    }
  }
}

template <Backend B> nn::Module<B>& DistributedDataParallel<B>::module() const { return impl_->module; }

template <Backend B> DistributedDataParallel<B>::NoSync::NoSync(DistributedDataParallel& d) : d_(&d), prev_(d.impl_->sync) {
  d.impl_->sync = false;
}
template <Backend B> DistributedDataParallel<B>::NoSync::~NoSync() { d_->impl_->sync = prev_; }
template <Backend B> bool DistributedDataParallel<B>::sync_enabled() const { return impl_->sync; }

template <Backend B> void DistributedDataParallel<B>::synchronize() {
  Impl& m = *impl_;
  if (!m.sync) return;
  if (m.round_active) {  // a pass that threw before its end
    m.finish_round();
  } else if (m.round_pass != autograd::backward_pass_count()) {  // the latest backward reached no parameter
    m.start_round();
    m.finish_round();
  }
}

template <Backend B> std::vector<typename DistributedDataParallel<B>::Bucket> DistributedDataParallel<B>::buckets() const {
  std::vector<Bucket> out;
  for (const auto& b : impl_->buckets) {
    Bucket r{.dtype = b.dtype, .numel = b.numel, .params = {}};
    for (size_t i : b.params) r.params.push_back(impl_->params[i].name);
    out.push_back(std::move(r));
  }
  return out;
}

template <Backend B> typename DistributedDataParallel<B>::Stats DistributedDataParallel<B>::stats() const { return impl_->stats; }
template <Backend B> void DistributedDataParallel<B>::reset_stats() { impl_->stats = Stats{}; }

#define KILN_INST(B) template class DistributedDataParallel<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::dist
