#pragma once
// kiln::fit: a training loop for any nn::Module (burn's Learner::fit, a small C++ Lightning).
//
//   MLP<Cpu> model(784, 256, 10);
//   optim::Adam<Cpu> opt(model.named_parameters(), {.lr = 2e-3});
//   DataLoader train(train_set, {.batch_size = 128, .shuffle = true}), test(test_set, {.batch_size = 1000, .shuffle = false});
//   FitResult r = fit(model, opt, train, test,
//       [&](const auto& batch) {                       // one batch: forward + loss (+ metrics to log)
//         const auto& [x, y] = batch;
//         return nn::cross_entropy(model.forward(x), y);  // a Var<B>, or a StepOutput<B>
//       },
//       {.epochs = 5, .grad_clip = 1.0, .eval_every = 469, .checkpoint_path = "ck.safetensors",
//        .log_path = "log.jsonl", .schedule = {.name = "cosine", .warmup_steps = 100}});
//
// (Designated initializers go in declaration order: FitOptions ends with lr, schedule, scheduler and ema.)
//
// fit(model, opt, train, step, options) trains; fit(model, opt, train, eval, step, options) also
// evaluates. The step function takes one batch (whatever the source yields) and returns the mean
// loss of that batch as a Var<B>, or a StepOutput<B> that adds metrics to log and the batch's sample
// and token counts. The same function evaluates, under NoGrad and model.eval()
// (model.is_training() tells it which).
//
// Data. Training data is either
//   - a DataLoader<D> (train/dataloader.hpp) over any IndexedDataset: passes in its (seeded,
//     resumable) order; the loop trains from the loader's current position. Or
//   - IndexedBatches{.batch = f}: batch i is f(i), a pure function of i (the GPT's
//     TokenData::batch(i, ...)). Micro-batch j of step s is f(s·grad_accum + j); no epochs.
// Evaluation data is a DataLoader (each evaluation runs one whole epoch, epoch 0's order) or
// IndexedBatches{.batch = f, .count = n} (batches 0..n-1).
//
// One optimizer step s (0-based), in order:
//   1. every parameter group's lr = schedule.at(peak, s, total_steps), peak = options.lr or, when 0,
//      the group's lr when fit started (groups keep their ratios); with a scheduler object
//      (options.scheduler), the lr it set;
//   2. gradients cleared (model and optimizer);
//   3. for each micro-batch j < m: fetch it; loss = step(batch); backward of loss/m (of loss itself
//      when m = 1). m = grad_accum, except at the end of a DataLoader epoch, where the window is
//      the batches left (windows never straddle epochs). With equal-sized micro-batches and mean
//      losses, k micro-batches of n give the gradient of one batch of k·n;
//   4. hooks.after_backward; the global L2 norm of the gradients (before clipping, in double);
//   5. a non-finite loss or norm (with f16 loss scaling: unless it is an overflow, below): on_nonfinite
//      = error throws a kiln::Error naming the step and the first parameter (dotted name) with a
//      non-finite gradient; skip zeroes the gradients, makes no update, counts the step and logs it
//      ("skipped": true), and the weights stay as they were;
//   6. otherwise clipping (grad_clip > 0: gradients × min(1, clip / (norm + 1e-6)), exactly
//      optim::clip_grad_norm), opt.step() and options.ema->update(); then options.scheduler->step()
//      (also after a skipped step);
//   7. evaluation when (s + 1) % eval_every == 0 or s is the run's last step (eval_every = 0: the
//      last step only), on the EMA weights when options.ema is set; a ReduceLROnPlateau scheduler
//      steps with its loss; then the on_eval callbacks. With eval_at_start (off by default, as
//      transformers' eval_on_start; nanoGPT and llm.c evaluate at step 0) a fresh run also
//      evaluates before step 0: logged as a record {"step": -1, "eval_loss": ...}, the first of
//      FitResult::eval_losses, on_eval called with FitState::step = -1; no scheduler steps on it;
//   8. the on_step callbacks; at the end of a DataLoader epoch the loader moves to the next epoch,
//      then the on_epoch callbacks;
//   9. one JSONL record: step, loss (mean over the micro-batches), lr (group 0), grad_norm, ms (wall
//      time of 1–6), tokens_per_s / samples_per_s where known, flops (of the step) and gflops where the step function gives them, eval_loss
//      and eval_<metric> when evaluated, the step function's metrics (means over micro-batches), what callbacks recorded; then what
//      callbacks print() and the progress bar;
//  10. a checkpoint when (s + 1) % checkpoint_every == 0;
//  11. stop when a callback asked, stop_after is reached or SIGINT/SIGTERM came (the step in
//      progress always finishes; a second signal kills at once). The run ends with a checkpoint
//      (when checkpoint_path is set).
//
// A time limit (time_limit_s > 0, wall seconds of the whole run: steps, evaluations and checkpoints,
// a resumed run's time before its checkpoint included; Lightning's max_time, with a plan):
//   - after kTimePlanSteps steps of this call have been timed (the first kTimePlanSkip not counted, nor
//     those that evaluated or checkpointed), the loop plans, before the next step: when the steps left,
//     at the mean time of those steps (the loop's whole iteration), with the evaluations and
//     checkpoints left (an evaluation at its measured time, or before the first one eval batches x
//     the mean forward time of a training micro-batch), would pass the limit, the run's total becomes
//     the steps that fit (at least one more). `schedule` then runs over that total: its warmup keeps
//     its steps and the decay ends at the new last step, so the run still ends annealed. The plan is
//     revised on the mean time of the steps timed since the last plan: every kTimePlanSteps timed
//     steps while the run is early (its warmup and the first tenth of the steps after it, where the lr
//     hardly depends on the total: the end may move anywhere up to the run's steps), then every
//     max(kTimePlanSteps, total/20), by at most kTimePlanMove of the steps either way (a cosine's lr
//     moves by about a percent of its peak at most), so that a slow or a fast patch moves the end by a
//     little and a lasting change of speed by as much as it needs.
//     Each plan that changes the total puts "planned_steps" in the record of the first step under it;
//     the first and those that move the end by 5% or more since the last printed print a line (with
//     the progress output); FitResult::planned_steps is the last total.
//     A scheduler object keeps the length it was built with (the first plan's line says so);
//   - whatever the plan, a step that ends with the limit passed is the run's last: it evaluates (as the
//     last step does), the run stops (FitResult::out_of_time) and ends with its checkpoint. The limit
//     is checked between steps, so a run ends after it by at most one step, an evaluation and the
//     final checkpoint;
//   - with several processes rank 0's clock decides, and the plans take the processes' mean step time;
//   - checkpoints carry time_limit.elapsed_s and time_limit.planned_steps: a resumed run with a time
//     limit counts the time already spent and keeps the plan (a run without one goes back to steps).
// Everything but the run's total is as without a limit: a run whose steps fit is bit for bit the run
// without one.
//
// A checkpoint (one safetensors file, written atomically: temp file, fsync, rename) holds the
// model's state dict ("model.<name>"), the optimizer's ("optim.<key>", including its step count),
// the EMA's ("ema.<key>", with options.ema), and as metadata: kiln_checkpoint = "1", step (completed
// optimizer steps), rng_seed / rng_offset (the default generator), grad_accum, optimizer (adam | sgd |
// the C++ type), skipped_steps, scheduler (its kind) and scheduler.<key> (its state) with
// options.scheduler, data.kind (loader | indexed), the DataLoaderState as data.* (loader) or
// data.fingerprint (indexed), plus options.metadata. Resuming (resume_path) restores all of it, so a
// run stopped and resumed computes bit for bit what a run that never stopped computes; a checkpoint
// from another model, optimizer, scheduler kind, EMA or not, grad_accum or data configuration is refused with a kiln::Error naming
// the difference, before anything is written. Before writing, the loop checks that every parameter
// is finite: a diverged run never replaces the last good checkpoint. A resumed run's log keeps the
// records of the steps before the checkpoint and appends.
//
// Errors: bad options (no or both of epochs/steps, values < 0, grad_accum < 1, ...) and bad resume
// files are kiln::Errors naming the option or file and the values, raised before any file is
// touched.
//
// Data parallelism (docs/distributed.md): wrap the model in dist::DistributedDataParallel, give each
// rank its share of every batch (a DataLoader with world_size/rank, or IndexedBatches returning
// dist::local_rows of batch i), and pass .hooks = dist::fit_hooks(ddp) (<kiln/train/dist_fit.hpp>). Then
// every micro-batch but the last runs inside no_sync(), the gradients are averaged after the last
// one, the logged loss, metrics and sample/token counts are the global ones, a stop (callback,
// signal, stop_after) on any rank stops every rank after the same step, and rank 0 alone writes the
// log, draws the progress bar, evaluates (the on_eval callbacks run there) and writes checkpoints.
// Every rank calls the optimizer's state_dict() for a checkpoint (a dist::ZeroOptimizer gathers its
// shards there) and every rank reads resume_path.
//
// Mixed precision (docs/mixed_precision.md): precision bf16 or f16 runs the step function (forward and
// loss, training and evaluation) inside autocast::Scope(precision); backward runs after the scope.
// Parameters, gradients and the optimizer stay in their own dtype (f32). f16 adds dynamic loss
// scaling (autocast::GradScaler with loss_scale): the loss is multiplied by the scale before backward,
// the gradients divided by it after hooks.after_backward (so after a DDP all-reduce); a step whose
// loss is finite but whose gradient norm is then not finite is an overflow: skipped ("overflow": true
// in the log, not counted as a non-finite step) and the scale backed off. A divergence is not: a
// non-finite loss (the forward's, computed before any scaling), or non-finite gradients while the
// scale is at or below loss_scale.min_scale (default 1: unscaled), go to on_nonfinite as in step 5
// and leave the scale as it is. Records carry "loss_scale". On the Cpu f16 runs but
// its matmuls compute in f32 (no f16 kernels; one notice on stderr): use bf16 there.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/autograd/autocast.hpp"
#include "kiln/backends/backends.hpp"
#include "kiln/nn/module.hpp"
#include "kiln/optim/ema.hpp"
#include "kiln/optim/optimizer.hpp"
#include "kiln/optim/schedule.hpp"
#include "kiln/optim/scheduler.hpp"
#include "kiln/train/dataloader.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln {

// What a step function may return instead of the bare loss.
template <Backend B> struct StepOutput {
  Var<B> loss{};                            // scalar: the batch's mean loss
  std::map<std::string, double> metrics{};  // logged under these names (eval: "eval_<name>")
  int64_t samples = 0;                      // samples in the batch (0: the first axis of a Tensor, or of a pair's first Tensor)
  int64_t tokens = 0;                       // tokens in the batch (0: unknown); gives tokens_per_s
  double flops = 0;                         // model FLOPs of the batch's forward + backward (0: unknown); gives flops and gflops
};

// A data source whose batch i is batch(i): deterministic in i, so the step is the data position.
template <class F> struct IndexedBatches {
  F batch;                    // batch(int64_t i) -> any batch type
  int64_t count = 0;          // evaluation: batches 0..count-1 (training: unbounded, ignored)
  std::string fingerprint{};  // what the batches are (data size, shape); a resume must match when both are set
};
template <class F> IndexedBatches(F, int64_t, std::string) -> IndexedBatches<F>;
template <class F> IndexedBatches(F, int64_t) -> IndexedBatches<F>;
template <class F> IndexedBatches(F) -> IndexedBatches<F>;

enum class NonFinite { error, skip };

// What callbacks see (after step `step`) and how they talk back.
struct FitState {
  int64_t step = 0;         // the optimizer step just completed (0-based); -1 at the evaluation before training
  int64_t total_steps = 0;  // of the whole run
  int64_t epoch = 0;        // DataLoader: the epoch this step belongs to (0 for IndexedBatches)
  double loss = 0, lr = 0, grad_norm = 0;
  double eval_loss = 0;                     // valid when evaluated
  bool evaluated = false;                   // this step ran an evaluation
  bool skipped = false;                     // no update this step: non-finite and skipped (on_nonfinite = skip), or an f16 overflow
  std::map<std::string, double> metrics{};  // logged with this step: step-function metrics, eval_*, and what callbacks add
  bool stop = false;                        // set it to end the run after this step (with a checkpoint)
  std::vector<std::string> messages{};      // lines to print (above the progress bar) after this step
  void record(const std::string& name, double value) { metrics[name] = value; }
  void print(std::string line) { messages.push_back(std::move(line)); }
};

struct Callback {
  std::function<void(FitState&)> on_step{};   // after every optimizer step (and its evaluation)
  std::function<void(FitState&)> on_eval{};   // after each evaluation
  std::function<void(FitState&)> on_epoch{};  // after the last step of a DataLoader epoch
};

// Extension points for data parallelism and mixed precision; the defaults are a single process.
struct FitHooks {
  // Runs micro-batch j of m (`run` does fetch, forward and backward): e.g. inside no_sync() for j < m-1.
  std::function<void(int64_t j, int64_t m, const std::function<void()>& run)> around_micro_batch{};
  std::function<void()> after_backward{};  // after the last micro-batch, before the norm (all-reduce)
  bool main_process = true;                // false: no log, progress bar, evaluation or checkpoint file from this process
  // Sums host numbers over the processes, in place; unset: one process. Called by every process at
  // the same points: once per step with the loss, metrics and sample/token counts (their global
  // values are logged; the loss and metrics are divided by `processes`), and once per step with
  // whether this process asks to stop. Every process's step function must report the same metric names.
  std::function<void(std::vector<double>&)> sum_over_processes{};
  int processes = 1;
};

struct FitOptions {
  int64_t epochs = 0;      // train until a DataLoader reaches this epoch (counted from 0) ...
  int64_t steps = 0;       // ... or for this many optimizer steps in total; exactly one is set
  int64_t grad_accum = 1;  // micro-batches per optimizer step
  double grad_clip = 0;    // max global L2 norm of the gradients (PyTorch clip_grad_norm_); 0 = off
  NonFinite on_nonfinite = NonFinite::error;
  DType precision = DType::f32;                   // f32 (off), bf16 or f16: the autocast dtype of the step function
  autocast::LossScaleOptions loss_scale{};        // precision f16 only
  int64_t eval_every = 0;                         // evaluate every this many steps and after the last (0: the last only)
  bool eval_at_start = false;                     // and before the first step (a fresh run, not a resumed one)
  std::string checkpoint_path{};                  // "" = no checkpoints
  int64_t checkpoint_every = 0;                   // 0 = only when the run ends
  std::string resume_path{};                      // a checkpoint of this loop to continue from
  std::string log_path{};                         // JSONL, one record per optimizer step
  int progress = -1;                              // progress on stdout: -1 (auto) or 1 on, 0 off; a bar redrawn in place on a
                                                  // terminal, plain lines (ProgressBar) when stdout is a file or a pipe
  int64_t stop_after = -1;                        // end (with a checkpoint) once this many steps are done in total; -1 = never
  double time_limit_s = 0;                        // wall seconds for the whole run (above: a plan, then a stop); 0 = none
  bool handle_signals = true;                     // SIGINT/SIGTERM finish the step, checkpoint and stop
  std::map<std::string, std::string> metadata{};  // extra checkpoint metadata (e.g. configs)
  std::vector<Callback> callbacks{};
  FitHooks hooks{};
  // The learning rate (last: GCC 12 warns falsely about a defaulted schedule followed by set members).
  double lr = 0;          // the schedule's peak; 0 = each parameter group's lr when fit starts
  LrSchedule schedule{};  // over total_steps (optim/schedule.hpp); default constant
  // A scheduler object built on the optimizer (optim/scheduler.hpp), instead of `schedule` and `lr`
  // (which then stay at their defaults): step() after every optimizer step, skipped ones included, so
  // the lr is a function of the step count; ReduceLROnPlateau: step(eval_loss) after every evaluation
  // (it needs evaluation data). Its state is saved in checkpoints and restored on resume.
  std::shared_ptr<optim::LRScheduler> scheduler{};
  // An exponential moving average of the weights (optim::EMA<B> over the model's parameters): update()
  // after every optimizer update (not after skipped steps); evaluation runs on the averages, swapped in
  // and back. Saved in checkpoints ("ema.*") and restored on resume.
  std::shared_ptr<optim::EmaBase> ema{};
};

struct FitResult {
  int64_t start_step = 0;             // 0, or the resumed checkpoint's step
  int64_t steps_done = 0;             // optimizer steps completed in total (skipped ones included)
  int64_t skipped = 0;                // non-finite steps skipped, in total
  std::vector<double> losses{};       // of the steps run in this call
  std::vector<double> eval_losses{};  // of the evaluations run in this call
  std::vector<int64_t> eval_steps{};  // for each: the optimizer steps done (0: before training, s + 1: after step s)
  bool interrupted = false;           // SIGINT/SIGTERM
  bool stopped = false;               // a callback, stop_after or the time limit ended the run before total_steps
  bool out_of_time = false;           // the time limit ended it (FitOptions::time_limit_s)
  int64_t planned_steps = 0;          // the total the time limit's plan set (0: no plan shortened the run)
};

// The time limit's plan: after this many steps of a fit() call, the first kTimePlanSkip of them not
// timed (allocations, library set-up).
inline constexpr int64_t kTimePlanSkip = 3, kTimePlanSteps = 20;
inline constexpr double kTimePlanMove = 0.02;  // of the run's steps, the most a later revision moves its end

// The metadata every kiln checkpoint starts from (fit's, and save_checkpoint's in train/trainer.hpp):
// kiln_checkpoint = "1", step, rng_seed / rng_offset (the default generator now), grad_accum, and with
// an optimizer kind (Optimizer::kind(); "" = no optimizer state) optimizer and optimizer_kinds = "2".
KILN_API std::map<std::string, std::string> checkpoint_metadata(int64_t step, int64_t grad_accum, const std::string& optimizer_kind);

namespace fit_detail {

// The loop's view of a data source; the typed wrappers below hold the batch the loop last fetched.
class Source {
 public:
  virtual ~Source() = default;
  virtual bool indexed() const = 0;
  virtual int64_t batches_per_epoch() const = 0;  // IndexedBatches: its count
  virtual int64_t epoch() const = 0;
  virtual int64_t position() const = 0;
  virtual void set_epoch(int64_t e) = 0;
  virtual void fetch(int64_t index) = 0;                         // IndexedBatches: batch `index`; DataLoader: its next batch
  virtual std::map<std::string, std::string> state() const = 0;  // "data.*" metadata
  virtual void load_state(const std::map<std::string, std::string>& metadata) = 0;  // checks, then restores
  virtual const void* loader() const = 0;                                           // the DataLoader behind it (nullptr for IndexedBatches)
};

// DataLoaderState <-> checkpoint metadata (in the library).
std::map<std::string, std::string> loader_state(const DataLoaderState& s);
DataLoaderState loader_state(const std::map<std::string, std::string>& metadata);
std::map<std::string, std::string> indexed_state(const std::string& fingerprint);
void check_indexed_state(const std::map<std::string, std::string>& metadata, const std::string& fingerprint);
// A resumed run's log: keeps the records of steps < `before` (a torn or unparsable line, or one without
// an integer "step", is dropped); rewritten atomically. Nothing happens when `path` does not exist.
void truncate_log(const std::string& path, int64_t before);

template <class D> class LoaderSource final : public Source {
 public:
  using Batch = typename DataLoader<D>::Batch;
  explicit LoaderSource(DataLoader<D>& dl) : dl_(dl) {}
  bool indexed() const override { return false; }
  int64_t batches_per_epoch() const override { return dl_.batches_per_epoch(); }
  int64_t epoch() const override { return dl_.epoch(); }
  int64_t position() const override { return dl_.position(); }
  void set_epoch(int64_t e) override { dl_.set_epoch(e); }
  void fetch(int64_t) override {
    cur_.reset();
    cur_ = dl_.next();
    KILN_CHECK(cur_.has_value(), "fit: the DataLoader ended its epoch early");
  }
  std::map<std::string, std::string> state() const override { return loader_state(dl_.state()); }
  void load_state(const std::map<std::string, std::string>& m) override { dl_.load_state(loader_state(m)); }
  const void* loader() const override { return &dl_; }
  const Batch& current() const { return *cur_; }

 private:
  DataLoader<D>& dl_;
  std::optional<Batch> cur_;
};

template <class F> class IndexedSource final : public Source {
 public:
  using Batch = std::decay_t<std::invoke_result_t<const F&, int64_t>>;
  explicit IndexedSource(const IndexedBatches<F>& s) : s_(s) {}
  bool indexed() const override { return true; }
  int64_t batches_per_epoch() const override { return s_.count; }
  int64_t epoch() const override { return 0; }
  int64_t position() const override { return 0; }
  void set_epoch(int64_t) override {}
  void fetch(int64_t i) override {
    cur_.reset();
    cur_.emplace(s_.batch(i));
  }
  std::map<std::string, std::string> state() const override { return indexed_state(s_.fingerprint); }
  void load_state(const std::map<std::string, std::string>& m) override { check_indexed_state(m, s_.fingerprint); }
  const void* loader() const override { return nullptr; }
  const Batch& current() const { return *cur_; }

 private:
  const IndexedBatches<F>& s_;
  std::optional<Batch> cur_;
};

template <class D> auto make_source(DataLoader<D>& dl) { return std::make_unique<LoaderSource<D>>(dl); }
template <class F> auto make_source(const IndexedBatches<F>& s) { return std::make_unique<IndexedSource<F>>(s); }

template <class T> struct is_pair_like : std::false_type {};
template <class A, class C> struct is_pair_like<std::pair<A, C>> : std::true_type {};
template <class... T> struct is_pair_like<std::tuple<T...>> : std::bool_constant<(sizeof...(T) > 0)> {};

// Samples in a batch when the step function does not say: a Tensor's first axis, or its first member's.
template <Backend B, class Batch> int64_t batch_samples(const Batch& b) {
  if constexpr (std::is_same_v<Batch, Tensor<B>> || std::is_same_v<Batch, Var<B>>) {
    return b.dim() > 0 ? b.size(0) : 0;
  } else if constexpr (is_pair_like<Batch>::value) {
    return batch_samples<B, std::decay_t<std::tuple_element_t<0, Batch>>>(std::get<0>(b));
  } else {
    return 0;
  }
}

template <Backend B, class Fn, class Batch> StepOutput<B> run_step(Fn& fn, const Batch& b) {
  using R = std::decay_t<std::invoke_result_t<Fn&, const Batch&>>;
  StepOutput<B> out;
  if constexpr (std::is_same_v<R, StepOutput<B>>) {
    out = fn(b);
  } else {
    static_assert(std::is_convertible_v<R, Var<B>>, "fit: the step function must return Var<B> or StepOutput<B>");
    out.loss = fn(b);
  }
  if (out.samples == 0) out.samples = batch_samples<B, Batch>(b);
  return out;
}

// The engine, compiled once per backend in the library (train/loop.cpp).
template <Backend B> KILN_API FitResult fit(nn::Module<B>& model, optim::Optimizer<B>& opt, Source& train,
                                            const std::function<StepOutput<B>()>& step, Source* eval,
                                            const std::function<StepOutput<B>()>* eval_step, const FitOptions& o);

}  // namespace fit_detail

// Trains `model` with `opt` on `train`; `step(batch)` returns the batch's loss (Var<B> or StepOutput<B>).
template <Backend B, class Train, class Step>
FitResult fit(nn::Module<B>& model, optim::Optimizer<B>& opt, Train&& train, Step&& step, const FitOptions& o) {
  auto src = fit_detail::make_source(train);
  auto* s = src.get();
  const std::function<StepOutput<B>()> run = [&step, s] { return fit_detail::run_step<B>(step, s->current()); };
  return fit_detail::fit<B>(model, opt, *src, run, nullptr, nullptr, o);
}

// The same, evaluating on `eval` with the same step function (under NoGrad and model.eval()).
template <Backend B, class Train, class Eval, class Step>
FitResult fit(nn::Module<B>& model, optim::Optimizer<B>& opt, Train&& train, Eval&& eval, Step&& step, const FitOptions& o) {
  auto src = fit_detail::make_source(train);
  auto ev = fit_detail::make_source(eval);
  auto* s = src.get();  // two declarations: the sources' types differ (one `auto` for both is ill-formed; GCC let it pass)
  auto* e = ev.get();
  const std::function<StepOutput<B>()> run = [&step, s] { return fit_detail::run_step<B>(step, s->current()); };
  const std::function<StepOutput<B>()> run_eval = [&step, e] { return fit_detail::run_step<B>(step, e->current()); };
  return fit_detail::fit<B>(model, opt, *src, run, ev.get(), &run_eval, o);
}

#define KILN_EXTERN_FIT(B)                                                                                 \
  extern template FitResult fit_detail::fit<B>(nn::Module<B>&, optim::Optimizer<B>&, fit_detail::Source&,  \
                                               const std::function<StepOutput<B>()>&, fit_detail::Source*, \
                                               const std::function<StepOutput<B>()>*, const FitOptions&);
KILN_FOR_EACH_BACKEND(KILN_EXTERN_FIT)
#undef KILN_EXTERN_FIT

}  // namespace kiln
#pragma GCC visibility pop
