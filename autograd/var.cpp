// Var<B>, the grad mode and the backward pass (the tape replayed in reverse). See autograd/var.hpp.
#include "kiln/autograd/var.hpp"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "kiln/autograd/record.hpp"
#include "kiln/backends/backends.hpp"
#include "kiln/core/profile.hpp"

namespace kiln {

// ---------------------------------------------------------------------------------- grad mode
namespace {
thread_local bool t_grad_enabled = true;
std::atomic<uint64_t> g_seq{0};
std::atomic<int64_t> g_hook_handle{0};
// The callbacks queued during the backward pass running on this thread (nullptr outside one).
thread_local std::vector<std::function<void()>>* t_pass_callbacks = nullptr;
thread_local uint64_t t_passes = 0;
// True while a backward pass that frees the graph (retain_graph false) runs on this thread.
thread_local bool t_frees_graph = false;
}  // namespace

bool grad_enabled() { return t_grad_enabled; }
void set_grad_enabled(bool on) { t_grad_enabled = on; }
NoGrad::NoGrad() : prev_(t_grad_enabled) { t_grad_enabled = false; }
NoGrad::~NoGrad() { t_grad_enabled = prev_; }

namespace autograd {
uint64_t next_seq() { return g_seq.fetch_add(1, std::memory_order_relaxed) + 1; }

void queue_backward_callback(std::function<void()> fn) {
  KILN_CHECK(t_pass_callbacks != nullptr, "queue_backward_callback: no backward pass is running on this thread");
  KILN_CHECK(fn != nullptr, "queue_backward_callback: empty callback");
  t_pass_callbacks->push_back(std::move(fn));
}
bool in_backward() { return t_pass_callbacks != nullptr; }
uint64_t backward_pass_count() { return t_passes; }

std::vector<int64_t> reduce_axes(const std::vector<int64_t>& axes, const Shape& shape, const char* op) {
  const auto rank = static_cast<int64_t>(shape.size());
  std::vector<int64_t> out;
  if (axes.empty() || rank == 0) {
    for (int64_t i = 0; i < rank; ++i) out.push_back(i);
    if (rank == 0)
      for (int64_t a : axes) normalize_axis(a, rank, op, shape);  // still validate
    return out;
  }
  for (int64_t a : axes) {
    const int64_t n = normalize_axis(a, rank, op, shape);
    KILN_CHECK(std::find(out.begin(), out.end(), n) == out.end(), "{}: axis {} repeated (shape {})", op, a, shape_str(shape));
    out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Shape keepdim_shape(const Shape& shape, const std::vector<int64_t>& axes) {
  Shape s = shape;
  for (int64_t a : axes) s[static_cast<size_t>(a)] = 1;
  return s;
}

template <Backend B> SegmentCollector<B>*& active_collector() {
  thread_local SegmentCollector<B>* c = nullptr;
  return c;
}

template <Backend B> void SegmentCollector<B>::note(const std::shared_ptr<Node<B>>& n) {
  if (!n->is_leaf() && n->seq > fence) return;  // made inside the segment
  if (std::find(boundary.begin(), boundary.end(), n) == boundary.end()) boundary.push_back(n);
}

template <Backend B> Node<B>::~Node() {
  // Destroying the last handle to a long chain would recurse once per node; unlink iteratively.
  std::vector<std::shared_ptr<Node>> stack = std::move(inputs);
  while (!stack.empty()) {
    std::shared_ptr<Node> n = std::move(stack.back());
    stack.pop_back();
    if (n && n.use_count() == 1) {
      for (auto& i : n->inputs) stack.push_back(std::move(i));
      n->inputs.clear();
    }
  }
}

namespace {
// Adds g into a leaf's .grad. The first gradient is stored as a fresh contiguous tensor that nothing
// else shares, so optimizers and clipping may update .grad in place.
template <Backend B> void accumulate_leaf(Node<B>& n, Tensor<B> g) {
  if (!n.grad.defined()) {
    if (!g.is_contiguous() || !g.sole_owner()) g = g.clone();
    n.grad = std::move(g);
  } else {
    n.grad = n.grad.add(g);
  }
}

template <Backend B> void check_grad(const Node<B>& to, const Tensor<B>& g, const char* from) {
  KILN_CHECK(g.shape() == to.value.shape() && g.dtype() == to.value.dtype(),
             "backward: '{}' produced a gradient of shape {} {} for an input of shape {} {}", from, shape_str(g.shape()), g.dtype(),
             shape_str(to.value.shape()), to.value.dtype());
}

// Runs a leaf's post-accumulate hooks (on a copy: a hook may remove itself).
template <Backend B> void run_leaf_hooks(Node<B>& leaf) {
  const auto hooks = leaf.post_accumulate_hooks;
  for (const auto& [handle, hook] : hooks) hook(leaf.grad);
}

// The pass's queued callbacks (queue_backward_callback): installed for the pass, dropped if it throws.
struct PassScope {
  std::vector<std::function<void()>> callbacks;
  std::vector<std::function<void()>>* prev;
  PassScope() : prev(t_pass_callbacks) {
    t_pass_callbacks = &callbacks;
    ++t_passes;
  }
  ~PassScope() { t_pass_callbacks = prev; }
  PassScope(const PassScope&) = delete;
  PassScope& operator=(const PassScope&) = delete;
  void finish() {
    for (size_t i = 0; i < callbacks.size(); ++i) callbacks[i]();  // a callback may queue another
  }
};

// One backward pass. Interior nodes are replayed in reverse creation order; a checkpointed segment's
// output node is replaced, when the pass reaches it, by the recomputed nodes of its segment, replayed
// at once (nested segments recursively): gradients reach every node and leaf in the order they would
// have without checkpointing, so the sums are the same, bit for bit.
template <Backend B> class Pass {
  using N = Node<B>;

 public:
  void run(const std::shared_ptr<N>& root, Tensor<B> seed) {
    // Collect the interior nodes reachable from the root that carry gradient. For leaves with
    // post-accumulate hooks, count the edges into them: the hooks run when the last one is replayed.
    std::vector<std::shared_ptr<N>> tape;
    std::unordered_set<N*> seen;
    std::vector<N*> stack{root.get()};
    seen.insert(root.get());
    while (!stack.empty()) {
      N* n = stack.back();
      stack.pop_back();
      if (n->is_leaf()) continue;
      KILN_CHECK(!n->released,
                 "backward: the graph through '{}' (output shape {}) was already freed by an earlier backward(); "
                 "recompute the forward pass to backward again",
                 n->op, shape_str(n->value.shape()));
      for (const auto& in : n->inputs) {
        if (in && in->requires_grad && in->is_leaf() && !in->post_accumulate_hooks.empty()) ++hooked_uses_[in.get()];
        if (in && in->requires_grad && seen.insert(in.get()).second) {
          stack.push_back(in.get());
          tape.push_back(in);
        }
      }
    }
    if (!root->is_leaf()) tape.push_back(root);
    std::erase_if(tape, [](const std::shared_ptr<N>& n) { return n->is_leaf(); });
    // Tape order is creation order: replay it in reverse.
    std::sort(tape.begin(), tape.end(), [](const auto& a, const auto& b) { return a->seq > b->seq; });

    if (root->is_leaf()) {
      accumulate_leaf(*root, std::move(seed));
      run_leaf_hooks(*root);
      return;
    }
    pending_.emplace(root.get(), std::move(seed));
    for (auto& n : tape) {
      replay(*n, nullptr);
      for (const auto& in : n->inputs) {  // this node's edges into hooked leaves are done
        if (hooked_uses_.empty()) break;
        const auto u = in ? hooked_uses_.find(in.get()) : hooked_uses_.end();
        if (u == hooked_uses_.end() || --u->second > 0) continue;
        hooked_uses_.erase(u);
        if (hooked_got_grad_.count(in.get())) run_leaf_hooks(*in);
      }
      // Every node that sends n a gradient was numbered after it and has run: unless the graph is
      // retained, free n's closure (the tensors it saved) and its links now, and drop the tape's handle,
      // so that its value goes too unless a Var outside still holds it.
      if (!retain_graph_) release(*n);
      n.reset();
    }
  }

  explicit Pass(bool retain_graph) : retain_graph_(retain_graph) {}

 private:
  // Replays n if a gradient reached it. `boundary`: inside a segment's replay, the segment's boundary
  // (a node numbered at or below the segment's fence must be among it); nullptr outside one.
  void replay(N& n, const std::unordered_set<N*>* boundary) {
    if (n.segment) {
      replay_segment(n);
      return;
    }
    auto it = pending_.find(&n);
    if (it == pending_.end()) return;  // no gradient reached this node
    Tensor<B> g = std::move(it->second);
    pending_.erase(it);
    KILN_CHECK(n.backward != nullptr,
               "backward: '{}' (output shape {}) was computed inside a checkpointed function (kiln::checkpoint) and used "
               "outside it; return it from the function instead",
               n.op, shape_str(n.value.shape()));
    Grads<B> gin;
    {
      const profile::Scope prof(profile::enabled() ? profile::detail::backward_name(n.op) : nullptr, "backward");
      gin = n.backward(g);
    }
    g = Tensor<B>();  // a gradient passed through as a view (t(), reshape) is then the only owner of its storage
    KILN_CHECK(gin.size() == n.inputs.size(), "backward: '{}' returned {} gradients for {} inputs", n.op, gin.size(), n.inputs.size());
    for (size_t i = 0; i < gin.size(); ++i) {
      N* in = n.inputs[i].get();
      if (!in || !in->requires_grad || !gin[i].defined()) continue;
      send(*in, std::move(gin[i]), n.op, boundary);
    }
  }

  void send(N& in, Tensor<B> g, const char* from, const std::unordered_set<N*>* boundary) {
    check_grad(in, g, from);
    if (in.is_leaf()) {
      accumulate_leaf(in, std::move(g));
      if (!hooked_uses_.empty() && hooked_uses_.count(&in)) hooked_got_grad_.insert(&in);
      return;
    }
    KILN_CHECK(!boundary || in.seq > fence_ || boundary->count(&in),
               "backward: the recomputation of a checkpointed function (kiln::checkpoint) read '{}' (shape {}), which its "
               "forward did not read: the function must compute the same thing when called again",
               in.op, shape_str(in.value.shape()));
    auto [slot, fresh] = pending_.try_emplace(&in, std::move(g));
    if (!fresh) {  // in place when nothing else holds the running sum (no new buffer per residual fork)
      Tensor<B>& sum = slot->second;
      if (sum.is_contiguous() && sum.sole_owner())
        sum.add_(g);  // try_emplace left g alone
      else
        sum = sum.add(g);
    }
  }

  // The segment of one of its output nodes: the first time the pass reaches one of them (the last
  // made; they are numbered together, after everything inside the segment and before everything that
  // uses them, so every output's gradient is complete), take the outputs' gradients, recompute and
  // replay. Its other output nodes then find no gradient.
  void replay_segment(N& n) {
    const std::shared_ptr<Segment<B>> seg = n.segment;
    if (!seg->recompute) return;
    std::vector<Tensor<B>> grads(seg->outputs.size());
    bool any = false;
    for (size_t i = 0; i < seg->outputs.size(); ++i) {
      const std::shared_ptr<N> o = seg->outputs[i].lock();
      if (!o) continue;
      auto it = pending_.find(o.get());
      if (it == pending_.end()) continue;
      grads[i] = std::move(it->second);
      pending_.erase(it);
      any = true;
    }
    if (!any) return;  // no gradient reached the segment
    const std::unordered_set<N*> boundary = [&] {
      std::unordered_set<N*> b;
      for (const auto& in : n.inputs) b.insert(in.get());
      return b;
    }();
    const uint64_t saved_fence = fence_;
    fence_ = next_seq();  // nodes made by the recomputation are numbered above it
    std::vector<Var<B>> outs;
    {
      const profile::Scope prof(profile::enabled() ? "checkpoint.recompute" : nullptr, "backward");
      outs = seg->recompute();
    }
    if (!retain_graph_) seg->recompute = nullptr;  // drops what fn captured
    size_t k = 0;
    std::vector<std::shared_ptr<N>> sub;  // the recomputed nodes reachable from the outputs
    std::unordered_set<N*> seen;
    std::vector<N*> stack;
    for (size_t i = 0; i < seg->recorded.size(); ++i) {
      if (!seg->recorded[i]) continue;
      const size_t slot = k++;
      if (!grads[slot].defined()) continue;
      const Var<B>& o = outs[i];
      KILN_CHECK(o.requires_grad(),
                 "backward: the recomputation of a checkpointed function (kiln::checkpoint): output {} "
                 "no longer requires grad",
                 i);
      N& on = *o.node();
      if (!on.is_leaf() && on.seq > fence_ && seen.insert(&on).second) {
        stack.push_back(&on);
        sub.push_back(o.node());
      }
      send(on, std::move(grads[slot]), "checkpoint", &boundary);
    }
    while (!stack.empty()) {
      N* m = stack.back();
      stack.pop_back();
      for (const auto& in : m->inputs)
        if (in && in->requires_grad && !in->is_leaf() && in->seq > fence_ && seen.insert(in.get()).second) {
          stack.push_back(in.get());
          sub.push_back(in);
        }
    }
    outs.clear();
    std::sort(sub.begin(), sub.end(), [](const auto& a, const auto& b) { return a->seq > b->seq; });
    for (auto& m : sub) {
      replay(*m, &boundary);
      release(*m);  // free the recomputed activations as soon as they are used (a retained graph recomputes again)
      m.reset();
    }
    fence_ = saved_fence;
  }

  // retain_graph=false: drops n's closure (and the tensors it saved), its segment and its links; a later
  // backward that reaches n is a kiln::Error.
  static void release(N& n) {
    n.backward = nullptr;
    n.segment = nullptr;
    n.inputs.clear();
    n.released = true;
  }

  bool retain_graph_;
  std::unordered_map<N*, Tensor<B>> pending_;
  std::unordered_map<N*, int64_t> hooked_uses_;
  std::unordered_set<N*> hooked_got_grad_;  // hooked leaves that received a gradient in this pass
  uint64_t fence_ = 0;
};

template <Backend B> void run_backward(const std::shared_ptr<Node<B>>& root, Tensor<B> seed, bool retain_graph) {
  PassScope pass;
  struct FreesGraph {  // restored on exit (a hook may run a nested pass)
    bool prev = t_frees_graph;
    explicit FreesGraph(bool on) { t_frees_graph = on; }
    ~FreesGraph() { t_frees_graph = prev; }
    FreesGraph(const FreesGraph&) = delete;
    FreesGraph& operator=(const FreesGraph&) = delete;
  } frees(!retain_graph);
  Pass<B>(retain_graph).run(root, std::move(seed));
  pass.finish();
}
}  // namespace

// The holders of an interior node not yet replayed: the pass (its tape, or a checkpoint replay's list
// of recomputed nodes) and the `inputs` of the node that consumes it. The walk follows the storage
// down the chain of nodes whose values share it; every storage handle must be one of those values or
// the closure's `saved`, so any other tensor, closure or pending gradient using the memory says no.
template <Backend B> bool saved_input_is_dead(const Var<B>& input, const Tensor<B>& saved) {
  if (!t_frees_graph || !saved.defined() || !saved.is_contiguous()) return false;
  const auto& st = saved.storage();
  if (input.node().use_count() != 3) return false;  // the pass, the consumer's inputs, the closure's capture
  long handles = 1;                                 // the closure's `saved`
  for (const Node<B>* n = input.node().get(); n;) {
    if (n->is_leaf() || n->released || !n->requires_grad || n->value.storage() != st) return false;
    ++handles;
    const Node<B>* next = nullptr;
    for (const auto& in : n->inputs)
      if (in && in->value.storage() == st) {
        if (next || in.use_count() != 2) return false;  // the pass and n's inputs, nothing else
        next = in.get();
      }
    n = next;
  }
  return st.use_count() == handles;
}

}  // namespace autograd

// ---------------------------------------------------------------------------------- Var
template <Backend B> Var<B>::Var(Tensor<B> value, bool requires_grad) : n_(std::make_shared<Node>()) {
  KILN_CHECK(value.defined(), "Var: undefined tensor");
  n_->value = std::move(value);
  if (requires_grad) requires_grad_(true);
}

template <Backend B> const Tensor<B>& Var<B>::value() const {
  static const Tensor<B> undefined;
  return n_ ? n_->value : undefined;
}

template <Backend B> Tensor<B> Var<B>::grad() const { return n_ ? n_->grad : Tensor<B>(); }

template <Backend B> void Var<B>::set_grad(Tensor<B> g) {
  KILN_CHECK(n_, "set_grad: undefined Var");
  KILN_CHECK(!g.defined() || (g.shape() == shape() && g.dtype() == dtype()), "set_grad: gradient {} {} for a Var of shape {} {}",
             shape_str(g.shape()), g.dtype(), shape_str(shape()), dtype());
  n_->grad = std::move(g);
}

template <Backend B> void Var<B>::zero_grad() {
  if (n_) n_->grad = Tensor<B>();
}

template <Backend B> Var<B>& Var<B>::requires_grad_(bool on) {
  KILN_CHECK(n_, "requires_grad_: undefined Var");
  KILN_CHECK(n_->is_leaf(), "requires_grad_: only leaves can change requires_grad; this Var was computed by '{}' (use detach())", n_->op);
  KILN_CHECK(!on || is_floating(dtype()), "requires_grad_: only float tensors can require grad, got {} (shape {})", dtype(),
             shape_str(shape()));
  n_->requires_grad = on;
  return *this;
}

template <Backend B> int64_t Var<B>::register_post_accumulate_hook(std::function<void(const Tensor<B>&)> hook) {
  KILN_CHECK(n_, "register_post_accumulate_hook: undefined Var");
  KILN_CHECK(n_->is_leaf(), "register_post_accumulate_hook: only leaves accumulate gradients; this Var was computed by '{}'", n_->op);
  KILN_CHECK(hook != nullptr, "register_post_accumulate_hook: empty hook");
  const int64_t handle = g_hook_handle.fetch_add(1, std::memory_order_relaxed) + 1;
  n_->post_accumulate_hooks.emplace_back(handle, std::move(hook));
  return handle;
}

template <Backend B> void Var<B>::remove_post_accumulate_hook(int64_t handle) {
  if (n_) std::erase_if(n_->post_accumulate_hooks, [handle](const auto& h) { return h.first == handle; });
}

template <Backend B> Var<B> Var<B>::detach() const {
  KILN_CHECK(n_, "detach: undefined Var");
  return Var(n_->value, false);
}

template <Backend B> void Var<B>::backward(bool retain_graph) const {
  KILN_CHECK(n_, "backward: undefined Var");
  KILN_CHECK(numel() == 1, "backward: loss has shape {}; pass a gradient of that shape", shape_str(shape()));
  backward(value().ones_like(), retain_graph);
}

template <Backend B> void Var<B>::backward(const Tensor<B>& grad_output, bool retain_graph) const {
  KILN_CHECK(n_, "backward: undefined Var");
  KILN_CHECK(n_->requires_grad,
             "backward: the loss (shape {}) does not require grad: no input requires grad, or it was computed under NoGrad",
             shape_str(shape()));
  KILN_CHECK(grad_output.defined(), "backward: undefined gradient for a loss of shape {}", shape_str(shape()));
  KILN_CHECK(grad_output.shape() == shape() && grad_output.dtype() == dtype(),
             "backward: gradient of shape {} {} for a loss of shape {} {}", shape_str(grad_output.shape()), grad_output.dtype(),
             shape_str(shape()), dtype());
  autograd::run_backward<B>(n_, grad_output, retain_graph);
}

#define KILN_AUTOGRAD_INSTANTIATE(B)                                        \
  template class Var<B>;                                                    \
  template struct autograd::Node<B>;                                        \
  template struct autograd::SegmentCollector<B>;                            \
  template autograd::SegmentCollector<B>*& autograd::active_collector<B>(); \
  template bool autograd::saved_input_is_dead<B>(const Var<B>&, const Tensor<B>&);
KILN_FOR_EACH_BACKEND(KILN_AUTOGRAD_INSTANTIATE)

}  // namespace kiln
