#pragma once
// Activation checkpointing: trade compute for memory by recomputing a segment's forward in backward.
//
//   Var<Cpu> y = kiln::checkpoint([&](const Var<Cpu>& x) { return block.forward(x); }, x);
//   std::vector<Var<Cpu>> ys = kiln::checkpoint<Cpu>(fn, {x1, x2});   // fn: vector<Var> -> vector<Var>
//
// checkpoint(fn, inputs) runs fn(inputs) without keeping its intermediates: its ops record nothing
// (they run exactly as when recording, so the values are the same), and the Vars from outside that
// fn reads (its inputs, the parameters and any other Var it closes over: the segment's "boundary")
// are noted. Each output that requires grad becomes one tape entry holding the boundary. When
// backward reaches the segment, fn runs again with recording on, under the random-number and
// autocast state of the first run (the thread's default Generator's seed and offset, and the
// generators listed in CheckpointOptions, are set back and then restored: dropout draws the same
// mask; the autocast dtype is re-entered), and the recomputed nodes are replayed in place of the
// segment: gradients reach the boundary (inputs and parameters) in the same order as without
// checkpointing, so they are bit-identical wherever the kernels are deterministic. The recomputed
// activations are freed as soon as they have been used.
//
// What fn must do:
//   * compute the same thing when called again: capture by value what it reads (not a container the
//     caller changes afterwards), leave parameters unchanged until backward, and draw random numbers
//     only from the default generator or a generator listed in CheckpointOptions::generators.
//     A recomputation that reads a Var the first run did not read, or whose outputs change shape or
//     dtype, is a kiln::Error.
//   * not let an intermediate escape (store it in a captured variable, a KV cache): outside the
//     segment it has no history, and a backward through it is a kiln::Error.
// Nested checkpoints work (an inner segment is recomputed, then replayed, inside the outer one's
// replay). Under NoGrad, or when nothing fn reads requires grad, checkpoint is just fn(inputs).
// Under autocast, a parameter is cast once per segment (the cast cache is per segment), not once per
// outermost scope: identical results unless one parameter is used both inside and outside a segment.
#include <functional>
#include <type_traits>
#include <vector>

#include "kiln/autograd/var.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

struct CheckpointOptions {
  // Generators fn draws from besides the thread's default one (their state is saved and restored like
  // the default generator's). They must outlive the backward pass.
  std::vector<Generator*> generators;
};

template <Backend B> using CheckpointFn = std::function<std::vector<Var<B>>(const std::vector<Var<B>>&)>;

template <Backend B>
KILN_API std::vector<Var<B>> checkpoint(CheckpointFn<B> fn, const std::vector<Var<B>>& inputs, const CheckpointOptions& options = {});

// One input, one output: fn(const Var<B>&) -> Var<B>.
template <Backend B, class F>
requires std::is_invocable_r_v<Var<B>, F&, const Var<B>&> Var<B> checkpoint(F fn, const Var<B>& x, const CheckpointOptions& options = {}) {
  CheckpointFn<B> f = [fn = std::move(fn)](const std::vector<Var<B>>& in) mutable { return std::vector<Var<B>>{fn(in[0])}; };
  return checkpoint<B>(std::move(f), std::vector<Var<B>>{x}, options)[0];
}

#define KILN_CHECKPOINT_EXTERN(B) \
  extern template std::vector<Var<B>> checkpoint<B>(CheckpointFn<B>, const std::vector<Var<B>>&, const CheckpointOptions&);
KILN_FOR_EACH_BACKEND(KILN_CHECKPOINT_EXTERN)
#undef KILN_CHECKPOINT_EXTERN

}  // namespace kiln
#pragma GCC visibility pop
