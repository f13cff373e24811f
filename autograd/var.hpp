#pragma once
// Var<B>: a Tensor<B> that remembers how it was computed, so backward() can differentiate through it.
//
// The tape, made safe. DESIGN.md §3 asks for a tape; kiln keeps it *implicit*: every differentiable
// op's output gets a node holding
//   - its value (a Tensor<B>), and for leaves the accumulated .grad,
//   - requires_grad and a sequence number drawn from a global atomic counter at creation,
//   - shared_ptrs to the nodes of its inputs (nullptr for inputs that need no gradient),
//   - a backward closure that captures only what its formula needs (exp saves its output, a view
//     saves only shapes, mul saves each operand only when the *other* one requires grad).
// Creation order is tape order: an op's output is always numbered after its inputs, so
// backward(loss) collects the nodes reachable from loss, sorts them by sequence number, descending —
// the tape replayed in reverse — and runs each closure once, summing the gradients of values used
// several times. Each node is freed as soon as its closure has run (every node that sends it a
// gradient was made after it, so has run before it): its closure with the tensors it saved, its links
// and, unless a Var outside still holds it, its value; an intermediate gradient goes as soon as it is
// consumed. The backward-time peak is then the activations not yet reached plus the gradients in
// flight, not the whole graph plus the gradients (docs/memory.md). As PyTorch's retain_graph=false, a
// second backward through the same graph throws kiln::Error; backward(retain_graph = true) frees
// nothing, so another backward may follow. (A pass that throws leaves the nodes it has run freed.)
// Leaves (Vars made by the user with requires_grad) keep and *accumulate* .grad across backward calls
// until zero_grad().
// Why not one global tape: a forward that is never followed by backward (evaluation, a forgotten
// NoGrad, an exception) would grow a global tape forever. Here the graph is owned by the Vars that
// can still reach it and disappears with them. (The counter is atomic rather than thread-local so
// that graphs handed between threads still sort correctly; its cost is one relaxed increment.)
//
// Ops record only when grad mode is on (see NoGrad) and some input requires grad; otherwise the
// output is a plain Var: no closure, no saved tensors, requires_grad() false. Inference records nothing.
//
// Gradients of broadcasting ops are summed back to each input's shape. Backward formulas are written
// with Tensor<B> ops (the fused softmax_backward for softmax/log_softmax), not with Var ops, so
// higher-order gradients (grad of grad) are out of scope.
//
// Not differentiable (return plain Tensors, or take the index as a Tensor): argmax/argmin,
// comparisons, sign, integer and bool results, the index arguments of gather/scatter_add/...,
// the condition of where.
//
// Generic code lives in autograd/*.cpp and autograd/ops/*.cpp, explicitly instantiated for the
// built-in backends (KILN_FOR_EACH_BACKEND); user code sees `extern template` and compiles fast.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "kiln/core/tensor.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

// ------------------------------------------------------------------------------------ grad mode
// Grad mode is per thread, on by default. NoGrad turns it off for its scope (nestable).
bool grad_enabled();
void set_grad_enabled(bool on);
struct NoGrad {
  NoGrad();
  ~NoGrad();
  NoGrad(const NoGrad&) = delete;
  NoGrad& operator=(const NoGrad&) = delete;

 private:
  bool prev_;
};

template <Backend B> class Var;

namespace autograd {
// One gradient per input of a node, in input order; an undefined Tensor means "no gradient".
template <Backend B> using Grads = std::vector<Tensor<B>>;
// grad_out (the gradient of the node's output, its shape) -> gradients of the node's inputs.
template <Backend B> using BackwardFn = std::function<Grads<B>(const Tensor<B>& grad_out)>;

template <Backend B> struct Node;

// Activation checkpointing (autograd/checkpoint.hpp). A segment is one kiln::checkpoint call: its
// outputs are nodes whose `inputs` are the segment's boundary (every Var from outside that its forward
// read: inputs, parameters, captured values) and whose `segment` points here. When the backward pass
// reaches the first of them, it calls `recompute` (fn again, recording, same RNG and autocast state)
// and replays the recomputed nodes in place of the segment, sending their gradients to the boundary.
template <Backend B> struct Segment {
  std::vector<std::weak_ptr<Node<B>>> outputs;     // the nodes made for fn's outputs (expired: not needed)
  std::vector<bool> recorded;                      // per output of fn: did it get a node (required grad)?
  std::function<std::vector<Var<B>>()> recompute;  // null once replayed
};

// While a segment's first forward runs (this thread), ops record nothing: their outputs are marked as
// requiring grad (so that every op takes the same path as when recording) and the Vars from outside the
// segment that they read are collected as its boundary.
template <Backend B> struct SegmentCollector {
  uint64_t fence = 0;  // nodes numbered above it were made inside the segment
  std::vector<std::shared_ptr<Node<B>>> boundary;
  void note(const std::shared_ptr<Node<B>>& n);
};
template <Backend B> SegmentCollector<B>*& active_collector();  // this thread's, nullptr when none

template <Backend B> struct Node {
  Tensor<B> value;
  Tensor<B> grad;  // leaves only: the accumulated gradient
  bool requires_grad = false;
  bool released = false;                      // an interior node whose closure an earlier backward freed
  uint64_t seq = 0;                           // tape position (creation order); 0 for leaves
  const char* op = nullptr;                   // the recording op ("mul", "matmul", ...); nullptr for leaves
  std::vector<std::shared_ptr<Node>> inputs;  // nullptr where that input needs no gradient
  BackwardFn<B> backward;
  std::shared_ptr<Segment<B>> segment;  // set on the outputs of kiln::checkpoint (their backward is the replay)
  // Leaves only: (handle, hook) pairs run after the last accumulation of a backward pass (Var::
  // register_post_accumulate_hook).
  std::vector<std::pair<int64_t, std::function<void(const Tensor<B>&)>>> post_accumulate_hooks;

  bool is_leaf() const { return op == nullptr; }
  Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  ~Node();  // unlinks long chains iteratively (no deep recursion when a 100k-step graph dies)
};

uint64_t next_seq();

// During a backward pass (called from a post-accumulate hook): runs `fn` once, when the pass has
// finished (every gradient accumulated, the graph freed), before backward() returns; callbacks run in
// the order they were queued. Outside a backward pass: kiln::Error. If the pass throws, its queued
// callbacks are dropped. (PyTorch's Engine::queue_callback; DistributedDataParallel waits for its
// gradient all-reduces there.)
void queue_backward_callback(std::function<void()> fn);
// True on this thread while a backward pass runs (inside hooks and queued callbacks of that pass).
bool in_backward();
// Backward passes started on this thread so far (tells whether the latest one reached a given hook).
uint64_t backward_pass_count();

// For a backward closure, while it runs: may it overwrite `saved`, the value of its input `input` that
// it saved (say with that input's gradient, of the same shape)? A closure that asks captures `input`.
// True only in a backward pass that frees the graph (retain_graph false), for a contiguous `saved`
// whose storage has no handle but the closure's `saved` and the values of `input`'s node and of the
// view nodes below it that share the memory (Linear's reshape of its product), where each of those
// nodes is interior (never a leaf: no parameter, no user tensor), not yet replayed, and held by nothing
// but the pass, the one node above it in the chain (for `input`: the consumer and the closure's
// capture). Then no Var, tensor or closure can read that memory again. False whenever in doubt.
template <Backend B> KILN_API bool saved_input_is_dead(const Var<B>& input, const Tensor<B>& saved);

// Family structs: each op family's forward and backward live in autograd/ops/<family>.cpp.
template <Backend B> struct Elementwise;
template <Backend B> struct Reduce;
template <Backend B> struct Linalg;
template <Backend B> struct SoftmaxOps;
template <Backend B> struct Views;
template <Backend B> struct Indexing;
}  // namespace autograd

template <Backend B> class Var {
 public:
  using backend = B;
  using Node = autograd::Node<B>;
  using E = autograd::Elementwise<B>;
  using R = autograd::Reduce<B>;
  using V = autograd::Views<B>;
  using I = autograd::Indexing<B>;

  Var() = default;                                   // undefined
  Var(Tensor<B> value, bool requires_grad = false);  // a leaf  NOLINT(google-explicit-constructor)
  explicit Var(std::shared_ptr<Node> node) : n_(std::move(node)) {}

  // ------------------------------------------------------------------------------ data and grad
  bool defined() const { return n_ != nullptr; }
  const Tensor<B>& value() const;
  Tensor<B> grad() const;  // undefined until a backward reaches this leaf (always undefined for non-leaves)
  void set_grad(Tensor<B> g);
  void zero_grad();  // drops the gradient (PyTorch's set_to_none)
  bool requires_grad() const { return n_ && n_->requires_grad; }
  Var& requires_grad_(bool on = true);  // leaves only
  bool is_leaf() const { return !n_ || n_->is_leaf(); }
  const char* grad_fn() const { return n_ ? n_->op : nullptr; }  // recording op, nullptr if none
  const std::shared_ptr<Node>& node() const { return n_; }       // the graph, for autograd internals
  Var detach() const;                                            // same value (shared storage), no history, requires_grad false

  // Leaves only. `hook(grad)` runs once in every backward pass that accumulates a gradient into this
  // leaf, right after that pass's last accumulation into it: .grad then holds its value at the end of
  // the pass (for a leaf used by several ops, after all of them; a pass that gives it no gradient runs
  // no hook). A hook may read .grad and queue_backward_callback(); it must not change the graph. Returns
  // a handle for remove_post_accumulate_hook. (PyTorch's register_post_accumulate_grad_hook.)
  int64_t register_post_accumulate_hook(std::function<void(const Tensor<B>& grad)> hook);
  void remove_post_accumulate_hook(int64_t handle);  // unknown handles are ignored

  // retain_graph: keep the graph (every closure and what it saved) for another backward through it;
  // false frees each node as soon as its backward has run.
  void backward(bool retain_graph = false) const;  // the loss must have one element; seeds with 1
  void backward(const Tensor<B>& grad_output, bool retain_graph = false) const;

  // ------------------------------------------------------------------------------ metadata
  const Shape& shape() const { return value().shape(); }
  int64_t dim() const { return value().dim(); }
  int64_t size(int64_t axis) const { return value().size(axis); }
  int64_t numel() const { return value().numel(); }
  DType dtype() const { return value().dtype(); }
  bool is_contiguous() const { return value().is_contiguous(); }
  // What fmt prints: the tensor, then grad_fn=<op> or requires_grad=True like PyTorch's repr.
  std::string str() const {
    if (!n_) return "Var(undefined)";
    if (n_->op) return fmt::format("{}, grad_fn={}", value().str(), n_->op);
    return n_->requires_grad ? value().str() + ", requires_grad=True" : value().str();
  }
  template <class T> T item() const { return value().template item<T>(); }

  // ------------------------------------------------------------------------------ elementwise
  Var neg() const { return E::neg(*this); }
  Var abs() const { return E::abs(*this); }
  Var square() const { return E::square(*this); }
  Var exp() const { return E::exp(*this); }
  Var log() const { return E::log(*this); }
  Var log1p() const { return E::log1p(*this); }
  Var expm1() const { return E::expm1(*this); }
  Var sqrt() const { return E::sqrt(*this); }
  Var rsqrt() const { return E::rsqrt(*this); }
  Var reciprocal() const { return E::reciprocal(*this); }
  Var sin() const { return E::sin(*this); }
  Var cos() const { return E::cos(*this); }
  Var tanh() const { return E::tanh(*this); }
  Var sigmoid() const { return E::sigmoid(*this); }
  Var relu() const { return E::relu(*this); }
  Var silu() const { return E::silu(*this); }
  Var gelu(bool tanh_approx = false) const { return E::gelu(*this, tanh_approx); }

  Var add(const Var& o) const { return E::add(*this, o); }
  Var sub(const Var& o) const { return E::sub(*this, o); }
  Var mul(const Var& o) const { return E::mul(*this, o); }
  Var div(const Var& o) const { return E::div(*this, o); }
  Var pow(const Var& o) const { return E::pow(*this, o); }
  Var maximum(const Var& o) const { return E::maximum(*this, o); }
  Var minimum(const Var& o) const { return E::minimum(*this, o); }
  Var add(Scalar s) const { return E::add_scalar(*this, s); }
  Var sub(Scalar s) const { return E::add_scalar(*this, Scalar(-s.to_double())); }
  Var mul(Scalar s) const { return E::mul_scalar(*this, s); }
  Var div(Scalar s) const { return E::div_scalar(*this, s); }
  Var pow(Scalar s) const { return E::pow_scalar(*this, s); }
  Var maximum(Scalar s) const { return E::maximum_scalar(*this, s); }
  Var minimum(Scalar s) const { return E::minimum_scalar(*this, s); }
  Var clamp(Scalar lo, Scalar hi) const { return E::clamp(*this, lo, hi); }
  Var to(DType dtype) const { return E::to(*this, dtype); }

  // Not differentiable: plain Tensors.
  Tensor<B> sign() const { return value().sign(); }
  Tensor<B> eq(const Var& o) const { return value().eq(o.value()); }
  Tensor<B> ne(const Var& o) const { return value().ne(o.value()); }
  Tensor<B> lt(const Var& o) const { return value().lt(o.value()); }
  Tensor<B> le(const Var& o) const { return value().le(o.value()); }
  Tensor<B> gt(const Var& o) const { return value().gt(o.value()); }
  Tensor<B> ge(const Var& o) const { return value().ge(o.value()); }
  Tensor<B> eq(Scalar s) const { return value().eq(s); }
  Tensor<B> ne(Scalar s) const { return value().ne(s); }
  Tensor<B> lt(Scalar s) const { return value().lt(s); }
  Tensor<B> le(Scalar s) const { return value().le(s); }
  Tensor<B> gt(Scalar s) const { return value().gt(s); }
  Tensor<B> ge(Scalar s) const { return value().ge(s); }
  Tensor<B> argmax(int64_t axis, bool keepdim = false) const { return value().argmax(axis, keepdim); }
  Tensor<B> argmin(int64_t axis, bool keepdim = false) const { return value().argmin(axis, keepdim); }
  Tensor<B> argmax() const { return value().argmax(); }

  // ------------------------------------------------------------------------------ reductions
  // Over the given axes (all when empty). max/min split the gradient equally among tied extremes.
  Var sum(const std::vector<int64_t>& axes = {}, bool keepdim = false) const { return R::sum(*this, axes, keepdim); }
  Var mean(const std::vector<int64_t>& axes = {}, bool keepdim = false) const { return R::mean(*this, axes, keepdim); }
  Var max(const std::vector<int64_t>& axes = {}, bool keepdim = false) const { return R::max(*this, axes, keepdim); }
  Var min(const std::vector<int64_t>& axes = {}, bool keepdim = false) const { return R::min(*this, axes, keepdim); }
  Var sum_to(const Shape& shape) const { return R::sum_to(*this, shape); }

  // ------------------------------------------------------------------------------ matmul, softmax
  Var matmul(const Var& o) const { return autograd::Linalg<B>::matmul(*this, o); }
  Var softmax(int64_t axis) const { return autograd::SoftmaxOps<B>::softmax(*this, axis, false); }
  Var log_softmax(int64_t axis) const { return autograd::SoftmaxOps<B>::softmax(*this, axis, true); }

  // ------------------------------------------------------------------------------ views
  Var view(Shape shape) const { return V::view(*this, std::move(shape)); }
  Var reshape(Shape shape) const { return V::reshape(*this, std::move(shape)); }
  Var permute(std::vector<int64_t> axes) const { return V::permute(*this, std::move(axes)); }
  Var transpose(int64_t a, int64_t b) const { return V::transpose(*this, a, b); }
  Var t() const { return V::t(*this); }
  Var narrow(int64_t axis, int64_t start, int64_t length) const { return V::narrow(*this, axis, start, length); }
  Var slice(int64_t axis, int64_t start, int64_t end, int64_t step = 1) const { return V::slice(*this, axis, start, end, step); }
  Var select(int64_t axis, int64_t index) const { return V::select(*this, axis, index); }
  Var expand(const Shape& shape) const { return V::expand(*this, shape); }
  Var broadcast_to(const Shape& shape) const { return V::expand(*this, shape); }
  Var squeeze() const { return V::squeeze(*this); }
  Var squeeze(int64_t axis) const { return V::squeeze_axis(*this, axis); }
  Var unsqueeze(int64_t axis) const { return V::unsqueeze(*this, axis); }
  Var flatten(int64_t start = 0, int64_t end = -1) const { return V::flatten(*this, start, end); }
  Var contiguous() const { return V::contiguous(*this); }
  Var clone() const { return V::clone(*this); }
  std::vector<Var> split(int64_t size, int64_t axis = 0) const { return V::split(*this, size, axis); }
  std::vector<Var> split(const std::vector<int64_t>& sizes, int64_t axis = 0) const { return V::split_sizes(*this, sizes, axis); }
  std::vector<Var> chunk(int64_t n, int64_t axis = 0) const { return V::chunk(*this, n, axis); }
  static Var cat(const std::vector<Var>& xs, int64_t axis = 0) { return V::cat(xs, axis); }
  static Var stack(const std::vector<Var>& xs, int64_t axis = 0) { return V::stack(xs, axis); }

  // ------------------------------------------------------------------------------ indexing
  // Differentiable with respect to this and src; the index is data.
  Var gather(int64_t axis, const Tensor<B>& index) const { return I::gather(*this, axis, index); }
  Var index_select(int64_t axis, const Tensor<B>& index) const { return I::index_select(*this, axis, index); }
  Var scatter_add(int64_t axis, const Tensor<B>& index, const Var& src) const { return I::scatter_add(*this, axis, index, src); }
  Var index_add(int64_t axis, const Tensor<B>& index, const Var& src) const { return I::index_add(*this, axis, index, src); }

  static Var where(const Tensor<B>& cond, const Var& a, const Var& b) { return E::where(cond, a, b); }

 private:
  std::shared_ptr<Node> n_;
};

}  // namespace kiln

template <kiln::Backend B> struct fmt::formatter<kiln::Var<B>> : fmt::formatter<std::string_view> {
  template <class Ctx> auto format(const kiln::Var<B>& v, Ctx& ctx) const { return fmt::format_to(ctx.out(), "{}", v.str()); }
};

#include "kiln/autograd/ops.hpp"  // the family structs and the free functions/operators
#pragma GCC visibility pop
