#include "kiln/autograd/autocast.hpp"

#include <cmath>
#include <unordered_map>

namespace kiln::autocast {

namespace {
thread_local DType g_dtype = DType::f32;  // f32: off
thread_local int g_depth = 0;

// The cast cache: a parameter's node -> (the parameter, its cast). Holding the parameter keeps its node
// alive, so a key cannot be reused by another node while cached.
template <Backend B> struct CastCache {
  struct Entry {
    Var<B> leaf, cast;
  };
  std::unordered_map<const void*, Entry> map;
};
template <Backend B> CastCache<B>& cache() {
  thread_local CastCache<B> c;
  return c;
}
void clear_caches() {
#define KILN_CLEAR(B) cache<B>().map.clear();
  KILN_FOR_EACH_BACKEND(KILN_CLEAR)
#undef KILN_CLEAR
}

}  // namespace

namespace detail {
namespace {
struct SavedCaches {
  std::vector<std::shared_ptr<void>> maps;  // one cast cache per backend, in KILN_FOR_EACH_BACKEND order
};
}  // namespace
CastCacheScope::CastCacheScope() {
  auto s = std::make_shared<SavedCaches>();
#define KILN_SWAP_OUT(B)                                                                    \
  s->maps.push_back(std::make_shared<decltype(cache<B>().map)>(std::move(cache<B>().map))); \
  cache<B>().map.clear();
  KILN_FOR_EACH_BACKEND(KILN_SWAP_OUT)
#undef KILN_SWAP_OUT
  saved_ = std::move(s);
}
CastCacheScope::~CastCacheScope() {
  auto& s = *static_cast<SavedCaches*>(saved_.get());
  size_t i = 0;
#define KILN_SWAP_IN(B) cache<B>().map = std::move(*static_cast<decltype(cache<B>().map)*>(s.maps[i++].get()));
  KILN_FOR_EACH_BACKEND(KILN_SWAP_IN)
#undef KILN_SWAP_IN
}
}  // namespace detail

bool enabled() { return g_dtype != DType::f32; }
DType dtype() { return g_dtype; }

Scope::Scope(DType dtype, bool on) : prev_(g_dtype) {
  KILN_CHECK(dtype == DType::bf16 || dtype == DType::f16 || dtype == DType::f32,
             "autocast::Scope: dtype must be bf16, f16 or f32 (off), got {}", dtype);
  g_dtype = on ? dtype : DType::f32;
  ++g_depth;
}

Scope::~Scope() {
  g_dtype = prev_;
  if (--g_depth == 0) clear_caches();
}

DType cast_dtype(Op op, DType d) {
  switch (policy(op)) {
    case Policy::low:
      return enabled() && (d == DType::f32 || is_half(d)) ? g_dtype : d;
    case Policy::f32:
      return enabled() && is_half(d) ? DType::f32 : d;
    case Policy::promote:
      break;
  }
  return d;
}

template <Backend B> Var<B> to_low(const Var<B>& x) {
  const DType d = x.dtype();
  if (!enabled() || d == g_dtype || !(d == DType::f32 || is_half(d))) return x;
  // Parameters: cast once per outermost scope (a weight used by several ops, e.g. tied embeddings).
  if (x.is_leaf() && x.requires_grad() && grad_enabled()) {
    auto& map = cache<B>().map;
    const void* key = x.node().get();
    auto it = map.find(key);
    if (it != map.end() && it->second.cast.dtype() == g_dtype && !it->second.cast.node()->released) return it->second.cast;
    Var<B> c = x.to(g_dtype);
    map[key] = {x, c};
    return c;
  }
  return x.to(g_dtype);
}

template <Backend B> Var<B> to_f32(const Var<B>& x) { return enabled() && is_half(x.dtype()) ? x.to(DType::f32) : x; }

template <Backend B> Var<B> cast(Op op, const Var<B>& x) {
  switch (policy(op)) {
    case Policy::low:
      return to_low(x);
    case Policy::f32:
      return to_f32(x);
    case Policy::promote:
      break;
  }
  return x;
}

const char* name(Op op) {
  switch (op) {
#define KILN_AUTOCAST_NAME(o, p) \
  case Op::o:                    \
    return #o;
    KILN_AUTOCAST_OPS(KILN_AUTOCAST_NAME)
#undef KILN_AUTOCAST_NAME
  }
  return "?";
}

GradScaler::GradScaler(LossScaleOptions o) : o_(o), scale_(o.init) {
  KILN_CHECK(o.init > 0 && std::isfinite(o.init) && o.growth >= 1 && o.backoff > 0 && o.backoff < 1 && o.interval >= 1 &&
                 o.min_scale >= 0 && std::isfinite(o.min_scale),
             "GradScaler: needs init > 0, growth >= 1, 0 < backoff < 1, interval >= 1, min_scale >= 0; got init={} growth={} "
             "backoff={} interval={} min_scale={}",
             o.init, o.growth, o.backoff, o.interval, o.min_scale);
}

void GradScaler::update(bool found_inf) {
  if (found_inf) {
    scale_ *= o_.backoff;
    good_ = 0;
  } else if (++good_ >= o_.interval) {
    scale_ *= o_.growth;
    good_ = 0;
  }
}

void GradScaler::set_state(double scale, int64_t good_steps) {
  KILN_CHECK(scale > 0 && std::isfinite(scale) && good_steps >= 0, "GradScaler: bad state scale={} good_steps={}", scale, good_steps);
  scale_ = scale;
  good_ = good_steps;
}

#define KILN_INST(B)                          \
  template Var<B> cast<B>(Op, const Var<B>&); \
  template Var<B> to_low<B>(const Var<B>&);   \
  template Var<B> to_f32<B>(const Var<B>&);
KILN_FOR_EACH_BACKEND(KILN_INST)
#undef KILN_INST

}  // namespace kiln::autocast
