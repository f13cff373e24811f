#pragma once
// kiln::dist: the process group and its collectives, for data-parallel training over processes and
// machines (docs/distributed.md).
//
//   int main() {
//     kiln::dist::init();                        // MPI_Init under mpirun/srun; alone: a group of one
//     auto g = Tensor<Cpu>::full({4}, dist::rank());
//     dist::all_reduce(g, dist::ReduceOp::avg);  // every rank now holds the mean over the ranks
//   }                                            // MPI is finalised at exit (or dist::finalize())
//
// The group is every process of the job (MPI_COMM_WORLD, duplicated so kiln's traffic never meets
// the program's own MPI calls). Rank, world size and local rank (the rank among the processes on this
// machine, e.g. the GPU to use) come from MPI. Built without MPI (KILN_WITH_MPI=OFF, or no
// libopenmpi-dev), the group has one process and every collective is the identity, so the same program
// runs unchanged; such a build refuses to start as one of several ranks (OMPI_COMM_WORLD_SIZE or
// PMI_SIZE > 1), instead of silently training N independent copies.
//
// Transport: a Tensor<Cpu> (or Reference) goes over MPI from its own memory; a Tensor<Cuda> goes over
// NCCL on its device memory (one communicator per process, created at the first Cuda collective on the
// current device, its unique id broadcast over MPI; ops run on a communication stream ordered after
// the tensor's producers and before its later users, so the host does not wait). dist/ never copies a
// tensor to the other side to communicate.
//
// Definitions (rank r's tensor x_r, N ranks; every rank gets the same bits):
//   all_reduce sum   x = Σ_r x_r. f32/f64: MPI's (NCCL's) float sum, in its order. i32/i64: wraps around
//                    on overflow (two's complement). bf16/f16: every x_r converted to f32 (exact), the
//                    f32 sum as above, rounded to the type once (not once per addition). bool: logical
//                    or (a sum clamped to true, as PyTorch's).
//   all_reduce avg   the sum above divided by N, in f32/f64 (bf16/f16: the f32 sum / N, rounded once).
//                    Float dtypes only.
//   all_reduce max/min  elementwise; bool: or / and.
//   broadcast        every rank's tensor becomes root's, bit for bit (any dtype).
//   all_gather       out[r] = x_r, bit for bit.
//   reduce_scatter   rank r receives row r of the all_reduce of the inputs' rows (same op rules).
//
// Tensors: any shape and size (0 elements, odd sizes, 0-dim). In-place results (all_reduce,
// broadcast, the `out` of the *_into forms) are written into the tensor's elements: the handle is
// const, its data is not, as for optimizers updating p.value(). Non-contiguous tensors are handled: a
// contiguous copy on the same backend is communicated and copied back (a copy each way); a tensor whose
// elements overlap (expanded) cannot be written and is an error.
//
// Errors (kiln::Error, on every rank that takes part): a collective before init() or after finalize();
// a root outside [0, N); output sizes that do not fit. With the consistency check on (the default,
// set_consistency_check), each collective first compares what the ranks passed (op, dtype, element
// count, shape, root) in one small all-reduce; a difference is an Error on every rank that names the
// op and each rank's values ("all_reduce: the ranks disagree: rank 0: f32 [3, 4] sum; rank 1: f32 [5]
// sum"), and a rank whose own arguments are wrong makes every rank raise, so no rank is left waiting.
// The asynchronous all_reduce_async runs the same check, blocking, when it is called (before the
// data's MPI_Iallreduce or NCCL call is started): so a mismatch raises there on every rank, and a
// started Work is always one every rank agreed on. It compares as an op of its own
// ("all_reduce_async"): a rank in all_reduce_async and another in all_reduce disagree (MPI never
// matches a nonblocking collective with a blocking one). The cost: the call waits until every rank
// has reached it (one small all-reduce); the data's transfer stays asynchronous. A nonblocking check
// (its exchange started with the data's and compared in wait) was not chosen: the data op must not
// start before the check has passed (ranks that disagree on the count would corrupt memory or hang),
// so every later collective would have to wait for the earlier checks anyway, to keep the ops in the
// same order on every rank.
// MPI failures are Errors naming the MPI call and the rank. A process that dies makes mpirun (or srun
// --kill-on-bad-exit) end every other rank at once and exit non-zero naming it: see
// docs/distributed.md, "When a rank dies".
//
// Threads: the collectives and DistributedDataParallel may be called from any one thread at a time
// (MPI_THREAD_SERIALIZED), not concurrently.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/backends/backends.hpp"
#include "kiln/core/tensor.hpp"

#pragma GCC visibility push(default)  // exported from libkiln (CMakeLists.txt: hidden by default)
namespace kiln::dist {

enum class ReduceOp { sum, avg, max, min };
const char* reduce_op_name(ReduceOp op);

struct InitOptions {
  // Every host collective gives up after this many seconds (a peer stuck or gone), naming the op and
  // the rank: Work::wait raises a kiln::Error, a blocking collective's watchdog ends the job (MPI_Abort).
  // 0 = never.
  // KILN_DIST_TIMEOUT (seconds) in the environment overrides it.
  double timeout_s = 1800;
  // The cross-rank consistency check of every collective (above). KILN_DIST_CHECK=0|1 overrides it.
  bool consistency_check = true;
};

// Starts the group: MPI_Init_thread unless the program initialised MPI itself (then kiln uses it and
// leaves finalising to the program). Idempotent. Without MPI: a group of one.
void init(const InitOptions& o = {});
// Ends it: NCCL communicators destroyed, MPI finalised if kiln initialised it. Also runs at exit.
void finalize();
bool is_initialized();
// True when a launcher started this process as one rank of a job (mpirun's OMPI_COMM_WORLD_SIZE, or
// PMI_SIZE / PMIX_RANK from srun and other PMI launchers). Programs that also run alone call init()
// only then, sparing a lone process MPI's start-up (`kiln train` does).
bool launched();
// True when this kiln was built with MPI (<kiln/config.hpp>: KILN_HAVE_MPI).
bool built_with_mpi();

// The calling process's place in the group (init() first).
int rank();
int world_size();
int local_rank();              // among the ranks on this machine (shared-memory node), from 0
int local_world_size();        // ranks on this machine
bool is_main_process();        // rank 0: the one that logs, evaluates and writes checkpoints
std::string processor_name();  // MPI's name of this machine ("" without MPI)

void set_consistency_check(bool on);
bool consistency_check();

// Blocks until every rank has called it.
void barrier();

// A collective started by an *_async call. test() advances it and says whether it is complete;
// wait() completes it (its result is then in the tensor) or raises. A default Work is complete.
// Destroying a Work that was not waited for waits for it.
class Work {
 public:
  struct Impl;
  Work() = default;
  explicit Work(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  bool test();
  void wait();
  bool completed() const;

 private:
  std::shared_ptr<Impl> impl_;
};

// In place: t becomes the reduction of every rank's t.
template <Backend B> KILN_API void all_reduce(const Tensor<B>& t, ReduceOp op = ReduceOp::sum);
// The same, started and not waited for (MPI_Iallreduce; on Cuda, NCCL on the communication stream).
// t must stay untouched until wait(). Consistency-checked like the blocking forms, at the call (above).
template <Backend B> KILN_API Work all_reduce_async(const Tensor<B>& t, ReduceOp op = ReduceOp::sum);
// In place: every rank's t becomes root's.
template <Backend B> KILN_API void broadcast(const Tensor<B>& t, int root = 0);
// [N, ...t.shape]: row r is rank r's t.
template <Backend B> KILN_API Tensor<B> all_gather(const Tensor<B>& t);
// out (N·t.numel() elements, t's dtype, any shape) receives the ranks' tensors one after another.
template <Backend B> KILN_API void all_gather_into(const Tensor<B>& out, const Tensor<B>& t);
// t has N rows (first axis): rank r gets row r of the reduction, shape t.shape[1:].
template <Backend B> KILN_API Tensor<B> reduce_scatter(const Tensor<B>& t, ReduceOp op = ReduceOp::sum);
// t has N·out.numel() elements (t's dtype): rank r's out gets elements [r·k, (r+1)·k) of the reduction.
template <Backend B> KILN_API void reduce_scatter_into(const Tensor<B>& out, const Tensor<B>& t, ReduceOp op = ReduceOp::sum);

// Reduces a host number over the ranks (e.g. a loss for the log).
double all_reduce_scalar(double x, ReduceOp op = ReduceOp::sum);
// The same for several numbers in one call, in place (every rank passes as many).
void all_reduce_scalars(std::vector<double>& xs, ReduceOp op = ReduceOp::sum);

// ------------------------------------------------------------------------------------ data slices
// Rank `rank`'s contiguous share of a global batch of `batch_size` rows: rows [start, start + count).
// The global batch must divide: otherwise a kiln::Error naming the batch size and the world size.
struct RowSlice {
  int64_t start = 0;
  int64_t count = 0;
};
RowSlice batch_slice(int64_t batch_size, int rank, int world_size);
RowSlice batch_slice(int64_t batch_size);  // this process's
// This process's rows of a global batch (a view along the first axis, no copy).
template <Backend B> KILN_API Tensor<B> local_rows(const Tensor<B>& batch);

#define KILN_EXTERN_DIST(B)                                                                  \
  extern template void all_reduce<B>(const Tensor<B>&, ReduceOp);                            \
  extern template Work all_reduce_async<B>(const Tensor<B>&, ReduceOp);                      \
  extern template void broadcast<B>(const Tensor<B>&, int);                                  \
  extern template Tensor<B> all_gather<B>(const Tensor<B>&);                                 \
  extern template void all_gather_into<B>(const Tensor<B>&, const Tensor<B>&);               \
  extern template Tensor<B> reduce_scatter<B>(const Tensor<B>&, ReduceOp);                   \
  extern template void reduce_scatter_into<B>(const Tensor<B>&, const Tensor<B>&, ReduceOp); \
  extern template Tensor<B> local_rows<B>(const Tensor<B>&);
KILN_FOR_EACH_BACKEND(KILN_EXTERN_DIST)
#undef KILN_EXTERN_DIST

}  // namespace kiln::dist
#pragma GCC visibility pop
