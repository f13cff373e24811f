#pragma once
// DistributedDataParallel: one model replica per process; gradients averaged over the processes
// during backward, so every rank takes the same optimizer step.
//
//   dist::init();
//   nn::GPT<Cpu> model(cfg);  model.init_weights(seed);
//   dist::DistributedDataParallel<Cpu> ddp(model);          // rank 0's weights everywhere
//   optim::Adam<Cpu> opt(model.named_parameters(), {...});
//   for (step ...) {
//     opt.zero_grad();
//     const auto [x, y] = batch(step);                      // the global batch
//     auto loss = lm_loss(model, dist::local_rows(x), dist::local_rows(y));
//     loss.backward();                                      // returns with averaged gradients
//     opt.step();
//   }
//
// Construction checks that every rank has the same parameters (names, shapes, dtypes; an Error names
// the first difference and the ranks), then broadcasts rank 0's parameters and buffers.
//
// Buffers (BatchNorm's running_mean, running_var, num_batches_tracked): each rank's forward updates
// its own from its own rows. With broadcast_buffers (the default, PyTorch DDP's broadcast_buffers=True)
// every synchronising round ends by broadcasting rank 0's buffers to every rank (one broadcast per
// dtype), so after each step every rank holds rank 0's bit for bit: the values PyTorch broadcasts
// before the next forward, here in place already for evaluation and checkpoints. Passes under
// no_sync() keep their own updates until the round that ends the step. Off: each rank keeps its own.
//
// Buckets. The parameters that require grad, in reverse registration order (about the order backward
// finalises them), are packed into flat buckets of one dtype each: the first holds up to
// first_bucket_mb, the others up to bucket_mb (PyTorch's defaults: 1 and 25 MiB). A bucket is a
// buffer of its parameters' gradients followed by one "used" flag per parameter.
//
// During backward (autograd's post-accumulate hook, autograd/var.hpp): when a parameter's gradient
// is final for the pass, it is copied into its bucket with flag 1; when every parameter of a bucket is
// in, and every earlier bucket has been launched, the bucket's all-reduce (avg) starts without waiting
// (MPI_Iallreduce; NCCL on its own stream), so communication overlaps the rest of backward. Buckets
// are launched in the same order on every rank. Each hook also advances the all-reduces in flight
// (MPI progresses them only when called).
//
// At the end of the pass (autograd::queue_backward_callback), parameters that got no gradient in it
// enter their buckets too: with the gradient accumulated by earlier passes under no_sync() (flag 1),
// or zeros (flag 0). So every rank completes every bucket, whatever its graph used. Then it waits for
// the all-reduces and gives each parameter its averaged gradient as .grad (a view into the bucket):
// the mean over the ranks, where ranks without one contribute zeros. A parameter no rank gave a
// gradient keeps an undefined .grad, as it would in one process, so optimizers skip it there too.
// backward() returns with the gradients averaged.
//
// A rank whose backward reached none of the parameters takes part through synchronize(), which a
// training loop calls after backward (it does nothing when the pass already synchronised).
//
// no_sync(): an RAII guard; backward passes inside it accumulate gradients locally without
// communicating (gradient accumulation). The first backward after it synchronises the sum.
//
// With equal-sized local batches and mean losses, the averaged gradient is the gradient of the global
// batch, so N ranks with a batch of B/N rows each compute the step of one process with B rows.
// Not thread-safe: one backward at a time, on the thread that uses the group.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/dist/process_group.hpp"
#include "kiln/nn/module.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::dist {

struct DDPOptions {
  double bucket_mb = 25;          // MiB per bucket (PyTorch's bucket_cap_mb)
  double first_bucket_mb = 1;     // MiB of the first bucket (the last layers, ready first)
  bool broadcast_buffers = true;  // rank 0's buffers to every rank at construction and after each round
};

template <Backend B> class DistributedDataParallel {
 public:
  explicit DistributedDataParallel(nn::Module<B>& module, DDPOptions o = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  nn::Module<B>& module() const;

  // Gradients of the backward passes inside the guard's scope accumulate without communication.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& d);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel* d_;
    bool prev_;
  };
  [[nodiscard]] NoSync no_sync() { return NoSync(*this); }
  bool sync_enabled() const;

  // Makes sure the gradients of this thread's latest backward pass are synchronised: does nothing if
  // that pass (or an earlier synchronize() after it) ran the round, else runs it now with this rank's
  // gradients (what a rank whose backward reached no parameter must do). Inside no_sync(): nothing.
  void synchronize();

  struct Bucket {
    DType dtype = DType::f32;
    int64_t numel = 0;                // gradient elements (plus one flag per parameter in the buffer)
    std::vector<std::string> params;  // in the order they lie in the bucket
  };
  std::vector<Bucket> buckets() const;

  // Timing of the synchronisations so far (for benchmarks): `wait_s` is the time the end of
  // backward spent waiting for all-reduces still in flight (the part not hidden behind backward).
  struct Stats {
    int64_t rounds = 0;
    double wait_s = 0;           // waiting at the end of the passes, in total
    double last_wait_s = 0;      // in the last round
    int64_t launched_early = 0;  // buckets launched before the end of their pass
    int64_t launched = 0;
  };
  Stats stats() const;
  void reset_stats();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

#define KILN_EXTERN_DDP(B) extern template class DistributedDataParallel<B>;
KILN_FOR_EACH_BACKEND(KILN_EXTERN_DDP)
#undef KILN_EXTERN_DDP

}  // namespace kiln::dist
#pragma GCC visibility pop
