// Activation checkpointing (autograd/checkpoint.hpp). The replay itself is in the backward pass
// (autograd/var.cpp, Pass::replay_segment); this file runs the first forward and builds the segment.
#include "kiln/autograd/checkpoint.hpp"

#include <optional>

#include "kiln/autograd/autocast.hpp"
#include "kiln/backends/backends.hpp"

namespace kiln {

namespace {
// (generator, seed, offset) of the default generator and the listed ones.
struct RngState {
  std::vector<Generator*> gens;
  std::vector<std::pair<uint64_t, uint64_t>> states;
  explicit RngState(const std::vector<Generator*>& extra) {
    gens.push_back(&default_generator());
    gens.insert(gens.end(), extra.begin(), extra.end());
    for (Generator* g : gens) states.emplace_back(g->seed(), g->offset());
  }
  // Sets the generators to the saved states; returns their present states.
  std::vector<std::pair<uint64_t, uint64_t>> swap_in() const {
    std::vector<std::pair<uint64_t, uint64_t>> now;
    for (size_t i = 0; i < gens.size(); ++i) {
      Generator& g = i == 0 ? default_generator() : *gens[i];  // the default generator of the thread running backward
      now.emplace_back(g.seed(), g.offset());
      g.set_state(states[i].first, states[i].second);
    }
    return now;
  }
  void restore(const std::vector<std::pair<uint64_t, uint64_t>>& now) const {
    for (size_t i = 0; i < gens.size(); ++i) (i == 0 ? default_generator() : *gens[i]).set_state(now[i].first, now[i].second);
  }
};

// Grad mode on (or as given) for a scope.
struct GradMode {
  bool prev = grad_enabled();
  explicit GradMode(bool on) { set_grad_enabled(on); }
  ~GradMode() { set_grad_enabled(prev); }
  GradMode(const GradMode&) = delete;
  GradMode& operator=(const GradMode&) = delete;
};

template <Backend B> struct CollectorScope {
  autograd::SegmentCollector<B> c;
  autograd::SegmentCollector<B>* prev = autograd::active_collector<B>();
  CollectorScope() {
    c.fence = autograd::next_seq();
    autograd::active_collector<B>() = &c;
  }
  ~CollectorScope() { autograd::active_collector<B>() = prev; }
  CollectorScope(const CollectorScope&) = delete;
  CollectorScope& operator=(const CollectorScope&) = delete;
};
}  // namespace

template <Backend B>
std::vector<Var<B>> checkpoint(CheckpointFn<B> fn, const std::vector<Var<B>>& inputs, const CheckpointOptions& options) {
  KILN_CHECK(fn != nullptr, "checkpoint: empty function");
  for (size_t i = 0; i < inputs.size(); ++i) KILN_CHECK(inputs[i].defined(), "checkpoint: input {} is undefined", i);
  for (Generator* g : options.generators) KILN_CHECK(g != nullptr, "checkpoint: null generator in CheckpointOptions::generators");
  // Nothing to save: NoGrad, or inside another segment's first forward (whose collector sees our ops).
  if (!grad_enabled() || autograd::active_collector<B>() != nullptr) return fn(inputs);

  const RngState rng(options.generators);
  const DType ac = autocast::dtype();  // f32: off
  std::vector<Var<B>> outs;
  std::vector<std::shared_ptr<autograd::Node<B>>> boundary;
  {
    const autocast::detail::CastCacheScope casts;
    CollectorScope<B> collect;
    outs = fn(inputs);
    for (const Var<B>& o : outs)  // an output fn passes through untouched (an input, a parameter) is boundary too
      if (o.requires_grad()) collect.c.note(o.node());
    boundary = std::move(collect.c.boundary);
  }
  auto seg = std::make_shared<autograd::Segment<B>>();
  std::vector<Shape> shapes;
  std::vector<DType> dtypes;
  for (size_t i = 0; i < outs.size(); ++i) {
    const Var<B>& o = outs[i];
    KILN_CHECK(o.defined(), "checkpoint: the function's output {} is undefined", i);
    seg->recorded.push_back(o.requires_grad());
    shapes.push_back(o.shape());
    dtypes.push_back(o.dtype());
  }
  bool any = false;
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!seg->recorded[i]) continue;  // e.g. an integer output: handed back as it is
    any = true;
    Var<B> v(outs[i].value());
    auto& node = *v.node();
    node.requires_grad = true;
    node.op = "checkpoint";
    node.seq = autograd::next_seq();  // after everything inside fn, before anything that uses the outputs
    node.inputs = boundary;
    node.segment = seg;
    node.backward = [](const Tensor<B>&) -> autograd::Grads<B> {
      KILN_CHECK(false, "checkpoint: internal: a segment's output was replayed as an ordinary node");
      return {};
    };
    seg->outputs.push_back(v.node());
    outs[i] = std::move(v);
  }
  if (!any) return outs;
  // The recomputation: fn again, recording, under the first run's random and autocast state.
  seg->recompute = [fn = std::move(fn), inputs, rng, ac, shapes, dtypes]() {
    const GradMode grad(true);
    const auto now = rng.swap_in();
    std::vector<Var<B>> r;
    try {
      const autocast::detail::CastCacheScope casts;
      const autocast::Scope scope(ac);
      r = fn(inputs);
    } catch (...) {
      rng.restore(now);
      throw;
    }
    rng.restore(now);
    KILN_CHECK(r.size() == shapes.size(), "checkpoint: the recomputation returned {} outputs, the first run {}", r.size(), shapes.size());
    for (size_t i = 0; i < r.size(); ++i)
      KILN_CHECK(r[i].defined() && r[i].shape() == shapes[i] && r[i].dtype() == dtypes[i],
                 "checkpoint: the recomputation's output {} is {} {}, the first run's {} {}: the function must compute the same "
                 "thing when called again",
                 i, r[i].defined() ? shape_str(r[i].shape()) : "undefined", r[i].defined() ? r[i].dtype() : dtypes[i], shape_str(shapes[i]),
                 dtypes[i]);
    return r;
  };
  return outs;
}

#define KILN_CHECKPOINT_INST(B) \
  template std::vector<Var<B>> checkpoint<B>(CheckpointFn<B>, const std::vector<Var<B>>&, const CheckpointOptions&);
KILN_FOR_EACH_BACKEND(KILN_CHECKPOINT_INST)

}  // namespace kiln
