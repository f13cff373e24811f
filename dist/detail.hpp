#pragma once
// kiln::dist's insides shared by dist/*.cpp and dist/cuda/nccl.cpp. Not a public header (cmake/
// KilnInstall.cmake leaves it out); it names neither MPI nor NCCL.
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kiln/backends/backends.hpp"
#include "kiln/backends/host_storage.hpp"
#include "kiln/dist/process_group.hpp"

#pragma GCC visibility push(default)
namespace kiln::dist {

// The backend of the group's own host-side values (scalars, hashes, flags): Cpu, or Reference in
// fuzz/'s reduced build, which has no other (backends/backends.hpp, KILN_REFERENCE_ONLY).
#if defined(KILN_REFERENCE_ONLY)
using HostValues = Reference;
#else
using HostValues = Cpu;
#endif

struct Work::Impl {
  virtual ~Impl() = default;
  virtual bool test() = 0;  // advances it; true once complete and finished (the result is in place)
  virtual void wait() = 0;  // completes and finishes it, or raises
  bool done = false;
};

namespace detail {

// The group, checked started: "<op>: the process group is not initialised ...".
void require_init(const char* op);
int group_rank();
int group_size();
double timeout_s();
// Sends n bytes from root to every rank over MPI (the Cuda side: NCCL's unique id).
void broadcast_bytes(void* data, size_t n, int root, const char* op);
// Runs at finalize(), before MPI is finalised (NCCL communicators).
void at_shutdown(std::function<void()> fn);

// The cross-rank consistency check (dist/consistency.cpp): every rank passes what its collective was
// given; a difference, or a rank whose own checks failed (local_error), raises on every rank. Off (or
// a group of one): only this rank's own error. all_reduce_async is a kind of its own: MPI never
// matches a nonblocking collective with a blocking one, so a rank in all_reduce_async and another in
// all_reduce would wait for each other for ever.
enum class Kind : int64_t { all_reduce = 1, broadcast, all_gather, reduce_scatter, barrier, all_reduce_async };
void agree(const char* op, Kind kind, DType d, int64_t numel, int64_t arg, const Shape& shape, const std::string& local_error);

// One collective on the wire, as the collectives (dist/collectives.cpp) hand it to a transport:
// contiguous buffers of one backend's memory, `count` elements of `dtype` (all_reduce/broadcast: the
// tensor; all_gather/reduce_scatter: per rank; bf16/f16 arrive as f32), op sum, max or min (avg is
// a sum the finisher divides), root for broadcast; all_reduce and broadcast work in place in recv.
enum class Coll { all_reduce, broadcast, all_gather, reduce_scatter };
struct WireCall {
  Coll coll = Coll::all_reduce;
  const void* send = nullptr;
  void* recv = nullptr;
  int64_t count = 0;
  DType dtype = DType::f32;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  int device = 0;  // the device of a device backend's buffers (-1 on the host)
  const char* what = "";
};

// The transports. Each starts the call and returns its Work, which completes when the data is in
// place and then runs `finish` (avg's division, the copy back into the caller's tensor); `keep` holds
// the buffers until then.
// Host memory (dist/mpi_transport.cpp): MPI; blocking or not, as asked (all_reduce only: the others
// always complete before returning).
std::shared_ptr<Work::Impl> mpi_start(const WireCall& c, std::function<void()> finish, std::vector<std::shared_ptr<const void>> keep,
                                      bool blocking);
// Cuda memory (dist/cuda/nccl.cpp, built with the Cuda backend): NCCL on raw device pointers of
// `device`, on the communication stream, ordered after what the device's stream queued so far. dtype
// is f32, f64, i32, i64 or bool. The Work completes when the NCCL op has (test: its event; wait: the
// device stream waits for it, the host does not), then runs `finish` (queued on the device stream).
std::shared_ptr<Work::Impl> nccl_start(const WireCall& c, std::function<void()> finish, std::vector<std::shared_ptr<const void>> keep);

// The transport of backend B's tensors: the per-backend trait the collectives call. Backends with host
// memory take MPI, Cuda takes NCCL; a new backend with memory of its own specialises it (in its own
// dist/<backend>/ folder: docs/adding_a_backend.md). Without one, it builds, and a collective of a
// group of more than one on its tensors is a kiln::Error naming the backend.
template <Backend B> struct Transport {
  static std::shared_ptr<Work::Impl> start(const WireCall& c, std::function<void()>, std::vector<std::shared_ptr<const void>>, bool) {
    fail("{}: the {} backend has no kiln::dist transport (specialise kiln::dist::detail::Transport<B>, dist/detail.hpp)", c.what, B::name);
  }
};
template <Backend B>
requires std::same_as<typename B::Storage, HostStorage>
struct Transport<B> {
  static std::shared_ptr<Work::Impl> start(const WireCall& c, std::function<void()> finish, std::vector<std::shared_ptr<const void>> keep,
                                           bool blocking) {
    return mpi_start(c, std::move(finish), std::move(keep), blocking);
  }
};
#if defined(KILN_HAVE_CUDA_BACKEND)
template <> struct Transport<Cuda> {
  static std::shared_ptr<Work::Impl> start(const WireCall& c, std::function<void()> finish, std::vector<std::shared_ptr<const void>> keep,
                                           bool blocking) {
    auto w = nccl_start(c, std::move(finish), std::move(keep));
    if (blocking) w->wait();
    return w;
  }
};
#endif

}  // namespace detail
}  // namespace kiln::dist
#pragma GCC visibility pop
