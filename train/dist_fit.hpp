#pragma once
// kiln::fit across processes: the FitHooks that make the generic loop (train/loop.hpp) data-parallel.
// (In train/, above dist/: the loop's hooks are train's, filled from what dist/ offers.)
//
//   dist::init();
//   dist::DistributedDataParallel<Cpu> ddp(model);                 // rank 0's weights everywhere
//   optim::Adam<Cpu> opt(model.named_parameters(), {.lr = 1e-3});  // or dist::ZeroOptimizer (ZeRO-1)
//   DataLoader train(data, {.batch_size = 64, .world_size = dist::world_size(), .rank = dist::rank()});
//   fit(model, opt, train, step, {.epochs = 3, .checkpoint_path = "ck.safetensors", .hooks = dist::fit_hooks(ddp)});
//
// With these hooks, micro-batches but the last of a step run under ddp.no_sync(), the step's gradients
// are synchronised after the last one (ddp.synchronize(), which also covers a rank whose graph reached
// no parameter), the loop's host numbers are summed over the ranks, and rank 0 is the main process
// (log, progress bar, evaluation, checkpoint files). See train/loop.hpp, "Data parallelism".
#include <functional>
#include <vector>

#include "kiln/dist/ddp.hpp"
#include "kiln/dist/process_group.hpp"
#include "kiln/train/loop.hpp"

namespace kiln::dist {

template <Backend B> FitHooks fit_hooks(DistributedDataParallel<B>& ddp) {
  FitHooks h;
  h.around_micro_batch = [&ddp](int64_t j, int64_t m, const std::function<void()>& run) {
    if (j + 1 < m) {
      const auto guard = ddp.no_sync();
      run();
    } else {
      run();
    }
  };
  h.after_backward = [&ddp] { ddp.synchronize(); };
  h.main_process = is_main_process();
  h.processes = world_size();
  if (world_size() > 1) h.sum_over_processes = [](std::vector<double>& xs) { all_reduce_scalars(xs, ReduceOp::sum); };
  return h;
}

}  // namespace kiln::dist
