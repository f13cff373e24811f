// The Cuda transport of kiln::dist: NCCL on device memory (dist/detail.hpp, detail::nccl_start).
//
// One communicator per process, created at the first Cuda collective of a group of more than one, on
// the device of that tensor (which must be the current device): rank 0's ncclGetUniqueId is broadcast
// over MPI, then ncclCommInitRank. Every op runs on a communication stream of its own: an event
// recorded on the device's stream (kiln's one stream) makes the op wait for the tensor's producers;
// completing the Work makes the device's stream wait for the op's event, so later kernels (and the
// caching allocator's reuse of the buffers, which is ordered on that stream) come after it. The host
// never waits. bf16/f16 arrive here as f32 (dist's staging), bool as bytes reduced with max/min.
//
// In the emulated-device build (tests/cuda_emu/emu_nccl.cpp) the same calls reach an NCCL stand-in that
// moves the device bytes with MPI.
#include "kiln/backends/cuda/runtime.hpp"
#include "kiln/dist/detail.hpp"

#if defined(KILN_HAVE_NCCL)
#include <nccl.h>
#endif

namespace kiln::dist::detail {

#if defined(KILN_HAVE_NCCL)
namespace {

struct Comm {
  ncclComm_t comm = nullptr;
  int device = -1;
  cudaStream_t stream = nullptr;
};
Comm& comm_state() {
  static Comm* c = new Comm;  // destroyed at dist::finalize (at_shutdown), never at static destruction
  return *c;
}

void check_nccl(ncclResult_t r, const char* what, const char* call) {
  if (r == ncclSuccess) return;
  fail("{}: {} failed on rank {} of {}: {}", what, call, group_rank(), group_size(), ncclGetErrorString(r));
}

Comm& get_comm(int device, const char* what) {
  Comm& c = comm_state();
  if (c.comm) {
    KILN_CHECK(c.device == device,
               "{}: the tensor is on cuda:{}, this process's NCCL communicator on cuda:{} (one device per rank: choose it with "
               "cuda::set_device(dist::local_rank()) before the first collective)",
               what, device, c.device);
    return c;
  }
  const int current = cuda::require_device(what);
  KILN_CHECK(current == device, "{}: the tensor is on cuda:{} but the current device is cuda:{}", what, device, current);
  ncclUniqueId id{};
  if (group_rank() == 0) check_nccl(ncclGetUniqueId(&id), what, "ncclGetUniqueId");
  broadcast_bytes(&id, sizeof id, 0, what);
  KILN_CUDA_CHECK_OP(what, cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
  check_nccl(ncclCommInitRank(&c.comm, group_size(), id, group_rank()), what, "ncclCommInitRank");
  c.device = device;
  at_shutdown([] {
    Comm& s = comm_state();
    if (s.comm) ncclCommDestroy(s.comm);
    s.comm = nullptr;
  });
  return c;
}

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::f32:
      return ncclFloat32;
    case DType::f64:
      return ncclFloat64;
    case DType::i32:
      return ncclInt32;
    case DType::i64:
      return ncclInt64;
    case DType::boolean:
      return ncclUint8;
    default:
      fail("dist: no NCCL reduction type for {}", d);
  }
}

ncclRedOp_t nccl_op(ReduceOp op, DType d) {
  const bool b = d == DType::boolean;  // 0/1 bytes: or = max, and = min
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return b ? ncclMax : ncclSum;  // avg: dist divides after the sum
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
  }
  return ncclSum;
}

struct NcclWork final : Work::Impl {
  cudaEvent_t ev = nullptr;
  ncclComm_t comm = nullptr;
  std::function<void()> finish;
  std::vector<std::shared_ptr<const void>> keep;
  std::string what;

  bool test() override {
    if (done) return true;
    const cudaError_t e = cudaEventQuery(ev);
    if (e == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not an error: clear it
      ncclResult_t async = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(comm, &async), what.c_str(), "ncclCommGetAsyncError");
      check_nccl(async, what.c_str(), "the NCCL operation");
      return false;
    }
    KILN_CUDA_CHECK_OP(what, e);
    complete();
    return true;
  }
  void wait() override {
    if (!done) complete();
  }
  void complete() {
    KILN_CUDA_CHECK_OP(what, cudaStreamWaitEvent(cuda::stream(), ev, 0));
    done = true;
    if (finish) finish();
    keep.clear();  // the device stream now orders any reuse after the op
  }
  ~NcclWork() override {
    try {
      if (!done) complete();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kiln::dist: %s\n", e.what());
    }
    if (ev) cudaEventDestroy(ev);
  }
};

}  // namespace

std::shared_ptr<Work::Impl> nccl_start(const WireCall& c, std::function<void()> finish, std::vector<std::shared_ptr<const void>> keep) {
  Comm& cm = get_comm(c.device, c.what);
  cudaStream_t compute = cuda::stream();
  cudaEvent_t ready = nullptr;
  KILN_CUDA_CHECK_OP(c.what, cudaEventCreate(&ready));
  KILN_CUDA_CHECK_OP(c.what, cudaEventRecord(ready, compute));
  KILN_CUDA_CHECK_OP(c.what, cudaStreamWaitEvent(cm.stream, ready, 0));
  KILN_CUDA_CHECK_OP(c.what, cudaEventDestroy(ready));
  const auto n = static_cast<size_t>(c.count);
  const size_t bytes = n * dtype_size(c.dtype);
  switch (c.coll) {
    case Coll::all_reduce:
      check_nccl(ncclAllReduce(c.send, c.recv, n, nccl_type(c.dtype), nccl_op(c.op, c.dtype), cm.comm, cm.stream), c.what, "ncclAllReduce");
      break;
    case Coll::broadcast:  // bit for bit, as bytes
      check_nccl(ncclBroadcast(c.send, c.recv, bytes, ncclUint8, c.root, cm.comm, cm.stream), c.what, "ncclBroadcast");
      break;
    case Coll::all_gather:
      check_nccl(ncclAllGather(c.send, c.recv, bytes, ncclUint8, cm.comm, cm.stream), c.what, "ncclAllGather");
      break;
    case Coll::reduce_scatter:
      check_nccl(ncclReduceScatter(c.send, c.recv, n, nccl_type(c.dtype), nccl_op(c.op, c.dtype), cm.comm, cm.stream), c.what,
                 "ncclReduceScatter");
      break;
  }
  auto w = std::make_shared<NcclWork>();
  w->comm = cm.comm;
  w->what = c.what;
  KILN_CUDA_CHECK_OP(c.what, cudaEventCreate(&w->ev));
  KILN_CUDA_CHECK_OP(c.what, cudaEventRecord(w->ev, cm.stream));
  w->finish = std::move(finish);
  w->keep = std::move(keep);
  return w;
}

#else

std::shared_ptr<Work::Impl> nccl_start(const WireCall& c, std::function<void()>, std::vector<std::shared_ptr<const void>>) {
  fail(
      "{}: this kiln was built without NCCL (KILN_WITH_MPI=OFF, or nccl.h / libnccl not found in the CUDA toolkit): Tensor<Cuda> "
      "collectives across processes need it",
      c.what);
}

#endif

}  // namespace kiln::dist::detail
