#pragma once
// ZeroOptimizer: ZeRO stage 1. Each rank keeps and updates the optimizer state of 1/N of the
// parameters' elements, then the ranks all-gather the updated parameters.
//
//   dist::DistributedDataParallel<Cpu> ddp(model);
//   dist::ZeroOptimizer<Cpu> opt(model.named_parameters(), optim::AdamOptions{.lr = 1e-3, .weight_decay = 0.1, .decoupled = true});
//   ... loss.backward(); opt.step(); ...
//   auto state = opt.state_dict();          // collective: the full state, as optim::Adam writes it
//   if (dist::is_main_process()) save(...);
//
// Sharding. Per dtype, the parameters (in group order) are laid end to end as one flat vector of T
// elements; rank r owns elements [r·S, min((r+1)·S, T)), S = ⌈T/N⌉. A parameter may be cut between
// ranks. Rank r's inner optimizer (optim::Adam or optim::SGD, PyTorch's semantics) holds its pieces as
// 1-D views into the parameters ("name" when whole, "name[a:b]" when cut) and their state (Adam: 2·T/N
// elements instead of 2·T). step(): the pieces take their slices of the gradients (every rank holds
// the averaged gradients: DistributedDataParallel all-reduces them, so clipping and the gradient norm
// work as in one process), the inner optimizer updates them in place, and an all-gather per dtype
// sends every rank the others' pieces. Adam's update is elementwise, so the result is the one process
// computes, up to the gradients' reduction order.
//
// Checkpoints. state_dict() is collective and gathers the full state under the keys optim::Adam and
// optim::SGD use ("exp_avg.<name>" with the parameter's shape, "step"), so it resumes in one process
// with a plain optimizer, or on any number of ranks with ZeroOptimizer::load_state_dict, which takes
// the full state on every rank and keeps its own slices.
//
// state_dict/load_state_dict override optim::Optimizer's, so a training loop holding a plain
// optim::Optimizer& (kiln::fit) checkpoints and resumes a ZeroOptimizer without knowing it is sharded;
// it must call state_dict() on every rank (it is collective) and may write it from rank 0 alone.
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/dist/process_group.hpp"
#include "kiln/optim/optimizer.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::dist {

template <Backend B> class ZeroOptimizer : public optim::Optimizer<B> {
 public:
  ZeroOptimizer(std::vector<optim::ParamGroup<B>> groups, optim::AdamOptions o);
  ZeroOptimizer(std::vector<optim::ParamGroup<B>> groups, optim::SGDOptions o);
  // docs/specs.md §4's grouping (weight decay on rank >= 2 tensors only), as optim::Adam/SGD's own.
  ZeroOptimizer(const optim::NamedParams<B>& params, optim::AdamOptions o)
      : ZeroOptimizer(optim::decay_groups(params, o.lr, o.weight_decay), o) {}
  ZeroOptimizer(const optim::NamedParams<B>& params, optim::SGDOptions o)
      : ZeroOptimizer(optim::decay_groups(params, o.lr, o.weight_decay), o) {}
  ~ZeroOptimizer() override;

  void step() override;  // collective
  // Collective: the full state (every rank gets it).
  std::vector<std::pair<std::string, Tensor<B>>> state_dict() const override;
  // The full state (as state_dict() or optim::Adam/SGD write it), given on every rank; strict as theirs.
  void load_state_dict(const std::map<std::string, Tensor<B>>& state) override;
  // A sharded optimizer checkpoints the full state of the one it shards: the same kind.
  std::string kind() const override { return shard_optimizer().kind(); }
  std::string momentum_kind() const override { return shard_optimizer().momentum_kind(); }
  bool reads_kind(const std::string& recorded, bool legacy) const override { return shard_optimizer().reads_kind(recorded, legacy); }

  const optim::Optimizer<B>& shard_optimizer() const;  // this rank's inner optimizer
  int64_t shard_numel() const;                         // parameter elements this rank updates
  int64_t total_numel() const;                         // of all ranks

 protected:
  std::vector<std::string> buffer_names() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

#define KILN_EXTERN_ZERO(B) extern template class ZeroOptimizer<B>;
KILN_FOR_EACH_BACKEND(KILN_EXTERN_ZERO)
#undef KILN_EXTERN_ZERO

}  // namespace kiln::dist
#pragma GCC visibility pop
