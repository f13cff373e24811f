// ZeroOptimizer (dist/zero.hpp): flat sharding per dtype, the inner optimizer on this rank's pieces,
// the parameters' all-gather, the gathered state.
#include "kiln/dist/zero.hpp"

#include <algorithm>

#include "kiln/backends/backends.hpp"
#include "kiln/dist/detail.hpp"

namespace kiln::dist {

template <Backend B> struct ZeroOptimizer<B>::Impl {
  struct Param {
    std::string name;
    Var<B> var;
    size_t space = 0;
    int64_t offset = 0, numel = 0;  // in its dtype's flat space
  };
  struct Space {  // the parameters of one dtype, end to end
    DType dtype = DType::f32;
    int64_t total = 0, per_rank = 0;
    std::vector<size_t> params;
  };
  struct Piece {
    size_t param = 0;
    int64_t start = 0, len = 0;  // within the parameter (flattened)
    std::string name;
    Var<B> var;  // a 1-D view of the parameter's elements
  };
  std::vector<Param> params;
  std::vector<Space> spaces;
  std::vector<Piece> pieces;
  std::vector<std::string> buffers;
  std::unique_ptr<optim::Optimizer<B>> inner;
  int rank = 0, n = 1;

  int64_t lo(const Space& s, int r) const { return std::min(s.total, r * s.per_rank); }
  int64_t hi(const Space& s, int r) const { return std::min(s.total, (r + 1) * s.per_rank); }
  template <class Make> void build(const std::vector<optim::ParamGroup<B>>& groups, Make make);
};

template <Backend B> template <class Make> void ZeroOptimizer<B>::Impl::build(const std::vector<optim::ParamGroup<B>>& groups, Make make) {
  Impl& m = *this;
  detail::require_init("ZeroOptimizer");
  m.rank = dist::rank();
  m.n = dist::world_size();
  std::vector<std::vector<size_t>> by_group;
  for (const auto& g : groups) {
    by_group.emplace_back();
    for (const auto& [name, v] : g.params) {
      KILN_CHECK(v.is_contiguous(), "ZeroOptimizer: parameter '{}' is not contiguous (shape {})", name, shape_str(v.shape()));
      size_t s = 0;
      while (s < m.spaces.size() && m.spaces[s].dtype != v.dtype()) ++s;
      if (s == m.spaces.size()) {
        m.spaces.emplace_back();
        m.spaces.back().dtype = v.dtype();
      }
      auto& sp = m.spaces[s];
      m.params.push_back({.name = name, .var = v, .space = s, .offset = sp.total, .numel = v.numel()});
      sp.total += v.numel();
      sp.params.push_back(m.params.size() - 1);
      by_group.back().push_back(m.params.size() - 1);
    }
  }
  for (auto& sp : m.spaces) sp.per_rank = (sp.total + m.n - 1) / m.n;
  std::vector<optim::ParamGroup<B>> inner_groups;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    optim::ParamGroup<B> ig{.params = {}, .lr = groups[gi].lr, .weight_decay = groups[gi].weight_decay};
    for (size_t i : by_group[gi]) {
      const auto& p = m.params[i];
      const auto& sp = m.spaces[p.space];
      const int64_t a = std::max(p.offset, m.lo(sp, m.rank)), b = std::min(p.offset + p.numel, m.hi(sp, m.rank));
      if (a >= b) continue;
      Piece pc{.param = i, .start = a - p.offset, .len = b - a, .name = p.name, .var = {}};
      if (pc.len != p.numel) pc.name = fmt::format("{}[{}:{}]", p.name, pc.start, pc.start + pc.len);
      pc.var = Var<B>(p.var.value().view({p.numel}).narrow(0, pc.start, pc.len), true);
      ig.params.emplace_back(pc.name, pc.var);
      m.pieces.push_back(std::move(pc));
    }
    inner_groups.push_back(std::move(ig));
  }
  m.inner = make(std::move(inner_groups));
}

template <Backend B> ZeroOptimizer<B>::ZeroOptimizer(std::vector<optim::ParamGroup<B>> groups, optim::AdamOptions o)
    : optim::Optimizer<B>(groups), impl_(std::make_unique<Impl>()) {
  impl_->build(groups, [&](std::vector<optim::ParamGroup<B>> g) { return std::make_unique<optim::Adam<B>>(std::move(g), o); });
  impl_->buffers = {"exp_avg", "exp_avg_sq"};
}

template <Backend B> ZeroOptimizer<B>::ZeroOptimizer(std::vector<optim::ParamGroup<B>> groups, optim::SGDOptions o)
    : optim::Optimizer<B>(groups), impl_(std::make_unique<Impl>()) {
  impl_->build(groups, [&](std::vector<optim::ParamGroup<B>> g) { return std::make_unique<optim::SGD<B>>(std::move(g), o); });
  impl_->buffers = {"momentum_buffer"};
}

template <Backend B> ZeroOptimizer<B>::~ZeroOptimizer() = default;

template <Backend B> std::vector<std::string> ZeroOptimizer<B>::buffer_names() const { return impl_->buffers; }
template <Backend B> const optim::Optimizer<B>& ZeroOptimizer<B>::shard_optimizer() const { return *impl_->inner; }
template <Backend B> int64_t ZeroOptimizer<B>::shard_numel() const {
  int64_t s = 0;
  for (const auto& p : impl_->pieces) s += p.len;
  return s;
}
template <Backend B> int64_t ZeroOptimizer<B>::total_numel() const {
  int64_t s = 0;
  for (const auto& sp : impl_->spaces) s += sp.total;
  return s;
}

template <Backend B> void ZeroOptimizer<B>::step() {
  Impl& m = *impl_;
  auto& ig = m.inner->groups();
  for (size_t g = 0; g < ig.size(); ++g) {  // schedules set the outer groups' lr
    ig[g].lr = this->groups_[g].lr;
    ig[g].weight_decay = this->groups_[g].weight_decay;
    ig[g].momentum = this->groups_[g].momentum;  // OneCycleLR's cycled momentum / beta1
  }
  NoGrad ng;
  for (auto& pc : m.pieces) {
    const Tensor<B> g = m.params[pc.param].var.grad();
    pc.var.set_grad(g.defined() ? g.reshape({m.params[pc.param].numel}).narrow(0, pc.start, pc.len) : Tensor<B>());
  }
  m.inner->step();
  this->steps_ = m.inner->step_count();
  for (auto& pc : m.pieces) pc.var.zero_grad();
  // Every rank's pieces to every rank, one all-gather per dtype.
  for (size_t s = 0; s < m.spaces.size(); ++s) {
    const auto& sp = m.spaces[s];
    if (sp.total == 0) continue;
    Tensor<B> send = Tensor<B>::zeros({sp.per_rank}, sp.dtype);
    const int64_t lo = m.lo(sp, m.rank);
    for (const auto& pc : m.pieces) {
      const auto& p = m.params[pc.param];
      if (p.space == s) send.narrow(0, p.offset + pc.start - lo, pc.len).copy_(pc.var.value());
    }
    const Tensor<B> all = Tensor<B>::empty({sp.per_rank * m.n}, sp.dtype);
    all_gather_into(all, send);
    for (size_t i : sp.params) {
      const auto& p = m.params[i];
      if (p.offset >= lo && p.offset + p.numel <= m.hi(sp, m.rank)) continue;  // all mine: already updated
      Tensor<B> w = p.var.value().view({p.numel});
      w.copy_(all.narrow(0, p.offset, p.numel));
    }
  }
}

template <Backend B> std::vector<std::pair<std::string, Tensor<B>>> ZeroOptimizer<B>::state_dict() const {
  const Impl& m = *impl_;
  std::map<std::string, Tensor<B>> local;
  for (auto& [k, t] : m.inner->state_dict()) local.emplace(k, t);
  std::map<std::string, std::map<std::string, Tensor<B>>> full;  // buffer -> parameter -> tensor
  for (const std::string& buf : m.buffers) {
    for (size_t s = 0; s < m.spaces.size(); ++s) {
      const auto& sp = m.spaces[s];
      if (sp.total == 0) continue;
      // has[i]: 1 = this rank's pieces of parameter i have this state, 0 = they have none, 2 = no piece here
      std::vector<int32_t> has(sp.params.size(), 2);
      Tensor<B> send = Tensor<B>::zeros({sp.per_rank}, sp.dtype);
      const int64_t lo = m.lo(sp, m.rank);
      for (const auto& pc : m.pieces) {
        const auto& p = m.params[pc.param];
        if (p.space != s) continue;
        const size_t k = static_cast<size_t>(std::find(sp.params.begin(), sp.params.end(), pc.param) - sp.params.begin());
        const auto it = local.find(buf + "." + pc.name);
        has[k] = it != local.end() ? 1 : 0;
        if (it != local.end()) send.narrow(0, p.offset + pc.start - lo, pc.len).copy_(it->second);
      }
      const Tensor<B> all = Tensor<B>::empty({sp.per_rank * m.n}, sp.dtype);
      all_gather_into(all, send);
      const auto flags = to_vector<int32_t>(all_gather(Tensor<HostValues>::from_vector(has)));
      for (size_t k = 0; k < sp.params.size(); ++k) {
        bool any = false, every = true;
        for (int r = 0; r < m.n; ++r) {
          const int32_t f = flags[static_cast<size_t>(r) * sp.params.size() + k];
          if (f == 2) continue;
          any = any || f == 1;
          every = every && f == 1;
        }
        const auto& p = m.params[sp.params[k]];
        KILN_CHECK(any == every, "ZeroOptimizer::state_dict: the ranks holding '{}' disagree on whether it has '{}' state", p.name, buf);
        if (every && any) full[buf][p.name] = all.narrow(0, p.offset, p.numel).view(p.var.shape()).clone();
      }
    }
  }
  std::vector<std::pair<std::string, Tensor<B>>> out;  // optim::Optimizer's order: buffer, then name
  for (auto& [buf, mp] : full)
    for (auto& [name, t] : mp) out.emplace_back(buf + "." + name, t);
  out.emplace_back("step", Tensor<B>::full({}, this->steps_, DType::i64));
  return out;
}

template <Backend B> void ZeroOptimizer<B>::load_state_dict(const std::map<std::string, Tensor<B>>& state) {
  Impl& m = *impl_;
  const auto st = state.find("step");
  KILN_CHECK(st != state.end(), "optimizer state: no 'step' entry");
  std::map<std::string, const typename Impl::Param*> by_name;
  for (const auto& p : m.params) by_name.emplace(p.name, &p);
  for (const auto& [key, t] : state) {
    if (key == "step") continue;
    const auto dot = key.find('.');
    const std::string buf = dot == std::string::npos ? key : key.substr(0, dot);
    KILN_CHECK(dot != std::string::npos && std::find(m.buffers.begin(), m.buffers.end(), buf) != m.buffers.end(),
               "optimizer state: unexpected entry '{}' (this optimizer keeps: {})", key, fmt::join(m.buffers, ", "));
    const auto p = by_name.find(key.substr(dot + 1));
    KILN_CHECK(p != by_name.end(), "optimizer state: '{}' names no parameter of this optimizer", key);
    KILN_CHECK(p->second->var.shape() == t.shape(), "optimizer state: '{}' has shape {}, the parameter has {}", key, shape_str(t.shape()),
               shape_str(p->second->var.shape()));
  }
  std::map<std::string, Tensor<B>> mine;
  for (const auto& pc : m.pieces) {
    const auto& p = m.params[pc.param];
    for (const std::string& buf : m.buffers) {
      const auto it = state.find(buf + "." + p.name);
      if (it != state.end()) mine[buf + "." + pc.name] = it->second.reshape({p.numel}).narrow(0, pc.start, pc.len).clone();
    }
  }
  mine["step"] = st->second;
  m.inner->load_state_dict(mine);
  this->steps_ = m.inner->step_count();
}

#define KILN_INST(B) template class ZeroOptimizer<B>;
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::dist
