// The emulated device's NCCL: the subset of libnccl that kiln::dist's Cuda transport calls
// (dist/cuda/nccl.cpp), with MPI carrying the bytes. Linked instead of libnccl into the emulated-device
// build (tests/cuda_emu/CMakeLists.txt) when kiln is built with MPI and NCCL, so Tensor<Cuda>
// collectives run under mpirun on processes that have no GPU.
//
//  * A communicator is an MPI communicator split from MPI_COMM_WORLD by the unique id (every rank that
//    passes the same id joins it) and ordered by the NCCL rank; nranks must match its size.
//  * Emulated device memory is host memory and streams run their work synchronously on the calling
//    thread (emu_cudart.cpp), so each call is the blocking MPI collective, issued at once: NCCL's
//    stream order becomes program order, which every rank keeps the same (as NCCL requires).
//  * Every buffer must lie inside one live device allocation (emu::device::contains), as on a GPU,
//    where a host pointer would fault; a bad one is ncclInvalidArgument, named on stderr.
//  * In-place calls (sendbuff == recvbuff; all_gather: sendbuff == recvbuff + rank·count) are NCCL's;
//    other overlaps are refused, as NCCL leaves them undefined.
// What this cannot tell: NCCL's own reduction order and speed, and anything about NVLink/IB.
#include <mpi.h>
#include <nccl.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "emu_device.hpp"

struct ncclComm {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
};

namespace {

ncclResult_t invalid(const std::string& what) {
  std::fprintf(stderr, "emulated NCCL: %s\n", what.c_str());
  return ncclInvalidArgument;
}

bool to_mpi(ncclDataType_t t, MPI_Datatype& out, size_t& size) {
  switch (t) {
    case ncclInt8:
      out = MPI_INT8_T;
      size = 1;
      return true;
    case ncclUint8:
      out = MPI_UINT8_T;
      size = 1;
      return true;
    case ncclInt32:
      out = MPI_INT32_T;
      size = 4;
      return true;
    case ncclUint32:
      out = MPI_UINT32_T;
      size = 4;
      return true;
    case ncclInt64:
      out = MPI_INT64_T;
      size = 8;
      return true;
    case ncclUint64:
      out = MPI_UINT64_T;
      size = 8;
      return true;
    case ncclFloat32:
      out = MPI_FLOAT;
      size = 4;
      return true;
    case ncclFloat64:
      out = MPI_DOUBLE;
      size = 8;
      return true;
    default:
      return false;  // f16/bf16: kiln::dist stages them as f32
  }
}

bool to_mpi(ncclRedOp_t op, MPI_Op& out) {
  switch (op) {
    case ncclSum:
      out = MPI_SUM;
      return true;
    case ncclProd:
      out = MPI_PROD;
      return true;
    case ncclMax:
      out = MPI_MAX;
      return true;
    case ncclMin:
      out = MPI_MIN;
      return true;
    default:
      return false;
  }
}

bool overlaps(const void* a, size_t an, const void* b, size_t bn) {
  const char *x = static_cast<const char*>(a), *y = static_cast<const char*>(b);
  return an > 0 && bn > 0 && x < y + bn && y < x + an;
}

ncclResult_t check_buffers(const char* call, const void* send, size_t send_bytes, const void* recv, size_t recv_bytes) {
  if (!emu::device::contains(send, send_bytes))
    return invalid(std::string(call) + ": sendbuff " + emu::device::describe(send) + " (" + std::to_string(send_bytes) +
                   " bytes) is not inside a live device allocation");
  if (!emu::device::contains(recv, recv_bytes))
    return invalid(std::string(call) + ": recvbuff " + emu::device::describe(recv) + " (" + std::to_string(recv_bytes) +
                   " bytes) is not inside a live device allocation");
  return ncclSuccess;
}

ncclResult_t mpi(int rc) { return rc == MPI_SUCCESS ? ncclSuccess : ncclSystemError; }

}  // namespace

extern "C" {

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return "no error (emulated NCCL)";
    case ncclInvalidArgument:
      return "invalid argument (emulated NCCL; see stderr)";
    case ncclSystemError:
      return "an MPI call failed (emulated NCCL)";
    default:
      return "error (emulated NCCL)";
  }
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return invalid("ncclGetUniqueId: null id");
  std::random_device rd;
  for (auto& c : id->internal) c = static_cast<char>(rd());
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
  if (!out) return invalid("ncclCommInitRank: null communicator");
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) return invalid("ncclCommInitRank: MPI is not initialised (the emulated NCCL moves bytes with MPI)");
  if (rank < 0 || rank >= nranks) return invalid("ncclCommInitRank: rank " + std::to_string(rank) + " of " + std::to_string(nranks));
  // The id's first bytes as the split colour: the ranks given the same id meet in one communicator.
  unsigned colour = 0;
  std::memcpy(&colour, id.internal, sizeof colour);
  auto* c = new ncclComm;
  if (MPI_Comm_split(MPI_COMM_WORLD, static_cast<int>(colour & 0x7fffffff), rank, &c->comm) != MPI_SUCCESS) {
    delete c;
    return ncclSystemError;
  }
  MPI_Comm_rank(c->comm, &c->rank);
  MPI_Comm_size(c->comm, &c->size);
  if (c->size != nranks || c->rank != rank) {
    MPI_Comm_free(&c->comm);
    delete c;
    return invalid("ncclCommInitRank: " + std::to_string(nranks) + " ranks announced, the id was given to another number");
  }
  *out = c;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (!c) return invalid("ncclCommDestroy: null communicator");
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && c->comm != MPI_COMM_NULL) MPI_Comm_free(&c->comm);
  delete c;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* err) {
  if (!c || !err) return invalid("ncclCommGetAsyncError: null argument");
  *err = ncclSuccess;  // every call completed (or failed) when it was made
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op, ncclComm_t c, cudaStream_t) {
  MPI_Datatype t;
  MPI_Op o;
  size_t es = 0;
  if (!c) return invalid("ncclAllReduce: null communicator");
  if (!to_mpi(type, t, es) || !to_mpi(op, o)) return invalid("ncclAllReduce: a type or op the emulation does not have");
  if (count == 0) return ncclSuccess;
  if (const ncclResult_t r = check_buffers("ncclAllReduce", send, count * es, recv, count * es); r != ncclSuccess) return r;
  if (send != recv && overlaps(send, count * es, recv, count * es)) return invalid("ncclAllReduce: partly overlapping buffers");
  return mpi(MPI_Allreduce(send == recv ? MPI_IN_PLACE : send, recv, static_cast<int>(count), t, o, c->comm));
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t c, cudaStream_t) {
  MPI_Datatype t;
  size_t es = 0;
  if (!c) return invalid("ncclBroadcast: null communicator");
  if (!to_mpi(type, t, es)) return invalid("ncclBroadcast: a type the emulation does not have");
  if (root < 0 || root >= c->size) return invalid("ncclBroadcast: root " + std::to_string(root) + " of " + std::to_string(c->size));
  if (count == 0) return ncclSuccess;
  // sendbuff is read on the root only (NCCL ignores it elsewhere).
  if (const ncclResult_t r = check_buffers("ncclBroadcast", c->rank == root ? send : recv, count * es, recv, count * es); r != ncclSuccess)
    return r;
  if (c->rank == root && send != recv) std::memmove(recv, send, count * es);
  return mpi(MPI_Bcast(recv, static_cast<int>(count), t, root, c->comm));
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type, ncclComm_t c, cudaStream_t) {
  MPI_Datatype t;
  size_t es = 0;
  if (!c) return invalid("ncclAllGather: null communicator");
  if (!to_mpi(type, t, es)) return invalid("ncclAllGather: a type the emulation does not have");
  if (count == 0) return ncclSuccess;
  const size_t n = count * es;
  if (const ncclResult_t r = check_buffers("ncclAllGather", send, n, recv, n * static_cast<size_t>(c->size)); r != ncclSuccess) return r;
  const void* mine = static_cast<const char*>(recv) + static_cast<size_t>(c->rank) * n;
  if (send != mine && overlaps(send, n, recv, n * static_cast<size_t>(c->size)))
    return invalid("ncclAllGather: sendbuff overlaps recvbuff but is not this rank's slot of it");
  return mpi(MPI_Allgather(send == mine ? MPI_IN_PLACE : send, static_cast<int>(count), t, recv, static_cast<int>(count), t, c->comm));
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op, ncclComm_t c,
                               cudaStream_t) {
  MPI_Datatype t;
  MPI_Op o;
  size_t es = 0;
  if (!c) return invalid("ncclReduceScatter: null communicator");
  if (!to_mpi(type, t, es) || !to_mpi(op, o)) return invalid("ncclReduceScatter: a type or op the emulation does not have");
  if (count == 0) return ncclSuccess;
  const size_t n = count * es, all = n * static_cast<size_t>(c->size);
  if (const ncclResult_t r = check_buffers("ncclReduceScatter", send, all, recv, n); r != ncclSuccess) return r;
  // In place (recvbuff = sendbuff + rank·count) or disjoint; MPI wants disjoint buffers, so an
  // in-place call reduces through a copy of the input.
  std::vector<char> copy;
  const void* in = send;
  if (overlaps(send, all, recv, n)) {
    if (recv != static_cast<const char*>(send) + static_cast<size_t>(c->rank) * n)
      return invalid("ncclReduceScatter: recvbuff overlaps sendbuff but is not this rank's slot of it");
    copy.assign(static_cast<const char*>(send), static_cast<const char*>(send) + all);
    in = copy.data();
  }
  return mpi(MPI_Reduce_scatter_block(in, recv, static_cast<int>(count), t, o, c->comm));
}

}  // extern "C"
